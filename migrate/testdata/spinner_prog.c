// Test program for ThreadSupervisor: N worker threads each increment their own counter
// forever. The test controls it through memory (process_vm_writev): `spawn` makes the main
// thread create one more worker, `quit[i]` makes worker i exit. Prints the counters' address
// and the worker tids, then "ready".
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX 16
volatile unsigned long counters[MAX];
volatile int quit[MAX];
volatile int spawn;
volatile int tids[MAX];

static void* worker(void* p) {
  long i = (long)p;
  tids[i] = gettid();
  while (!quit[i]) counters[i]++;
  return NULL;
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  pthread_t t[MAX];
  for (long i = 0; i < n; ++i) pthread_create(&t[i], NULL, worker, (void*)i);
  for (long i = 0; i < n; ++i) while (!tids[i]) sched_yield();
  printf("counters %p quit %p spawn %p tids", (void*)counters, (void*)quit, (void*)&spawn);
  for (int i = 0; i < n; ++i) printf(" %d", tids[i]);
  printf(" ready\n");
  fflush(stdout);
  for (;;) {
    if (spawn && n < MAX) {
      spawn = 0;
      pthread_create(&t[n], NULL, worker, (void*)(long)n);
      n++;
    }
    usleep(100);
  }
}
