/* The main thread's stack grows after the migration point: main joins its workers (the
 * migration point), then calls a function with a large local array, far below the stack's
 * extent at the checkpoint. Usage: stack_growth [KIB] (default 1024). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static volatile unsigned long spin;

static void* worker(void* arg) {
  for (long i = 0; i < 200000000L; i++) spin += (unsigned long)i;
  return NULL;
}

static __attribute__((noinline)) long deep(long kib) {
  volatile unsigned char buf[kib * 1024];
  for (long i = 0; i < kib * 1024; i++) buf[i] = (unsigned char)(i * 7);
  long s = 0;
  for (long i = 0; i < kib * 1024; i += 3) s += buf[i];
  return s;
}

int main(int argc, char** argv) {
  const long kib = argc > 1 ? atol(argv[1]) : 1024;
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, NULL);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  printf("%ld\n", deep(kib));
  return 0;
}
