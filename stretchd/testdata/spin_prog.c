// Threads that count through shared memory with atomics and spinning only (no futex, no
// join): the memory path of automatic mode alone. Run with --migrate_at_threads=N+1.
//   spin_prog THREADS ITERATIONS
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

static long counter;
static int started, finished, threads;
static long iterations;
static long per_thread[64];

static void* worker(void* arg) {
  long id = (long)arg;
  __atomic_fetch_add(&started, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&started, __ATOMIC_SEQ_CST) < threads) sched_yield();
  long mine = 0;
  for (long i = 0; i < iterations; ++i) {
    __atomic_fetch_add(&counter, 1, __ATOMIC_SEQ_CST);
    mine += i % 7;
  }
  per_thread[id] = mine;
  __atomic_fetch_add(&finished, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: spin_prog THREADS ITERATIONS\n");
    return 2;
  }
  threads = atoi(argv[1]);
  iterations = atol(argv[2]);
  if (threads < 1 || threads > 64) return 2;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (long i = 0; i < threads; ++i) {
    pthread_t t;
    if (pthread_create(&t, &attr, worker, (void*)i) != 0) return 1;
  }
  while (__atomic_load_n(&finished, __ATOMIC_SEQ_CST) < threads) sched_yield();
  long sum = 0;
  for (int i = 0; i < threads; ++i) sum += per_thread[i];
  printf("counter %ld sum %ld\n", counter, sum);
  return 0;
}
