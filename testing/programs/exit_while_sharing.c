/* Two workers write-share pages of a large heap until main returns from main() while they
 * still write: pages are moving between nodes as the process exits. Prints main's result.
 * With "crash", the second worker then dies of SIGSEGV instead, still sharing pages with the
 * first (a program that crashes on whichever node runs that worker as pages move).
 * Usage: exit_while_sharing [MIB [crash]] (default 64). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char* heap;
static size_t size;
static atomic_int crash_now;

static void* worker(void* arg) {
  const size_t k = (size_t)arg;
  for (size_t i = 0;; i++) {
    heap[(i * 4096 + k * 64) % size] += 1;
    if (k == 1 && atomic_load_explicit(&crash_now, memory_order_relaxed)) {
      *(volatile int*)(uintptr_t)8 = 1;
    }
  }
  return NULL;
}

int main(int argc, char** argv) {
  size = (size_t)(argc > 1 ? atol(argv[1]) : 64) << 20;
  heap = malloc(size);
  memset(heap, 1, size);
  pthread_t t[2];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, (void*)i);
  volatile unsigned long s = 0;
  for (unsigned long i = 0; i < 1500000000UL; i++) s += i;
  printf("done %lu\n", (unsigned long)(s & 0xff));
  if (argc > 2 && strcmp(argv[2], "crash") == 0) {
    fflush(stdout);
    atomic_store(&crash_now, 1);
    pthread_join(t[1], NULL);
  }
  return 0;
}
