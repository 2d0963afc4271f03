/* Threads that come and go: ROUNDS rounds, each of THREADS workers that compute on their own
 * buffer (PASSES passes over 32 KiB, 1000 passes about 2 ms here) and end, main joining them
 * before the next round. Prints the sum of what the workers returned, which depends only on
 * the arguments.
 * Usage: thread_churn [ROUNDS [THREADS [PASSES]]] (default 20 2 20000). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { kWords = 4096 };
static int passes = 20000;

static void* worker(void* arg) {
  const uint64_t seed = (uint64_t)(uintptr_t)arg;
  uint64_t* buffer = malloc(kWords * sizeof(uint64_t));
  if (buffer == NULL) abort();
  for (int i = 0; i < kWords; i++) buffer[i] = seed + (uint64_t)i;
  uint64_t sum = 0;
  for (int pass = 0; pass < passes; pass++) {
    for (int i = 0; i < kWords; i++) {
      buffer[i] = buffer[i] * 6364136223846793005ULL + 1442695040888963407ULL;
      sum += buffer[i] >> 33;
    }
  }
  free(buffer);
  return (void*)(uintptr_t)(sum & 0xffffffff);
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 20;
  const int threads = argc > 2 ? atoi(argv[2]) : 2;
  if (argc > 3) passes = atoi(argv[3]);
  if (rounds < 1 || threads < 1 || threads > 64 || passes < 1) {
    fprintf(stderr, "usage: thread_churn [ROUNDS [THREADS [PASSES]]]\n");
    return 2;
  }
  uint64_t total = 0;
  pthread_t t[64];
  for (int r = 0; r < rounds; r++) {
    for (int k = 0; k < threads; k++) {
      if (pthread_create(&t[k], NULL, worker, (void*)(uintptr_t)(r * 64 + k)) != 0) abort();
    }
    for (int k = 0; k < threads; k++) {
      void* result;
      pthread_join(t[k], &result);
      total += (uintptr_t)result;
    }
  }
  printf("done %llu\n", (unsigned long long)total);
  return 0;
}
