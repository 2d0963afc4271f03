/* Write sharing in pairs: --threads workers (even), worker 2k and 2k+1 each update their own
 * counters on one page of pair k, with --work units of computation between updates; pairs share
 * nothing with each other. A placement that splits a pair over two nodes makes the page
 * ping-pong between them on every update; one that keeps each pair on a node has no sharing
 * across nodes at all. Started in order, worker i is thread i+2 of the program (main is 1), so
 * `stretchd run`'s round-robin placement splits every pair: the case sharing-affinity
 * placement (`--placement=affinity`) exists for.
 *
 *   pair_sharing [--threads=4] [--iterations=200000] [--work=200]
 *
 * Prints each worker's count and checksum, the same natively and under stretchd run. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_THREADS 64

struct pair_page {
  _Alignas(4096) volatile uint64_t count[2];
  volatile uint64_t sum[2];
};

static struct pair_page g_pages[MAX_THREADS / 2];
static long g_iterations = 200000, g_work = 200;
static int g_threads = 4;

static void* worker(void* p) {
  const long id = (long)p;
  struct pair_page* page = &g_pages[id / 2];
  const int half = (int)(id % 2);
  uint64_t x = (uint64_t)id + 1;
  for (long i = 0; i < g_iterations; ++i) {
    for (long w = 0; w < g_work; ++w) x = x * 6364136223846793005ull + 1442695040888963407ull;
    page->count[half] += 1;
    page->sum[half] += x >> 40;
  }
  return NULL;
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!strncmp(argv[i], "--threads=", 10)) {
      g_threads = atoi(argv[i] + 10);
    } else if (!strncmp(argv[i], "--iterations=", 13)) {
      g_iterations = atol(argv[i] + 13);
    } else if (!strncmp(argv[i], "--work=", 7)) {
      g_work = atol(argv[i] + 7);
    } else {
      fprintf(stderr, "usage: %s [--threads=EVEN] [--iterations=N] [--work=N]\n", argv[0]);
      return 2;
    }
  }
  if (g_threads < 2 || g_threads > MAX_THREADS || g_threads % 2 != 0 || g_iterations < 1 ||
      g_work < 0) {
    fprintf(stderr, "--threads must be even, 2..%d; --iterations >= 1; --work >= 0\n",
            MAX_THREADS);
    return 2;
  }
  pthread_t t[MAX_THREADS];
  for (long i = 0; i < g_threads; ++i) {
    if (pthread_create(&t[i], NULL, worker, (void*)i) != 0) {
      fprintf(stderr, "pthread_create failed\n");
      return 1;
    }
  }
  for (int i = 0; i < g_threads; ++i) pthread_join(t[i], NULL);
  for (int i = 0; i < g_threads; ++i) {
    printf("worker %d count %llu sum %llu\n", i, (unsigned long long)g_pages[i / 2].count[i % 2],
           (unsigned long long)g_pages[i / 2].sum[i % 2]);
  }
  return 0;
}
