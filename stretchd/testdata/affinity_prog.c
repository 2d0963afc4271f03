/* Pins each of N workers to CPU `cpu` (argv[2]) with sched_setaffinity and prints, per
 * worker in order, whether that worked and the CPU it then runs on. Workers wait at a start
 * gate that main opens after a 100 ms timed wait (a migration point for stretchd run).
 *
 *   affinity_prog N CPU */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "experiments/workloads/common.h"

static int g_gate;
static int g_cpu;
static int g_ok[64], g_on[64];

static void* worker(void* p) {
  long id = (long)p;
  while (!__atomic_load_n(&g_gate, __ATOMIC_ACQUIRE)) sched_yield();
  cpu_set_t* set = CPU_ALLOC(g_cpu + 1);
  size_t size = CPU_ALLOC_SIZE(g_cpu + 1);
  CPU_ZERO_S(size, set);
  CPU_SET_S(g_cpu, size, set);
  g_ok[id] = sched_setaffinity(0, size, set) == 0;
  CPU_FREE(set);
  sched_yield();
  g_on[id] = sched_getcpu();
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s THREADS CPU\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  g_cpu = atoi(argv[2]);
  if (n < 1 || n > 64 || g_cpu < 0 || g_cpu > 4095) {
    fprintf(stderr, "THREADS must be 1..64 and CPU 0..4095\n");
    return 2;
  }
  pthread_t t[64];
  for (long i = 0; i < n; ++i) pthread_create(&t[i], NULL, worker, (void*)i);
  wl_timed_wait_ms(100);
  __atomic_store_n(&g_gate, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < n; ++i) pthread_join(t[i], NULL);
  for (int i = 0; i < n; ++i) printf("worker %d: pinned=%d cpu=%d\n", i, g_ok[i], g_on[i]);
  return 0;
}
