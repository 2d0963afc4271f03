/* A large heap at the migration point: main fills --mib MiB of malloc'd memory, then --threads
 * workers each checksum and rewrite their slice, and main prints the checksums. Measures what
 * migration costs for a big address space (checkpoint size, restore, first-touch fetches).
 *
 *   big_heap [--mib=100] [--threads=4]
 *
 * Prints "mib=<n> before=<hash> after=<hash>", the same natively and under stretchd run. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t* g_heap;
static size_t g_words;
static int g_threads = 4;
static uint64_t g_sums[64];

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

static void* worker(void* p) {
  long id = (long)p;
  size_t begin = g_words * (size_t)id / (size_t)g_threads;
  size_t end = g_words * (size_t)(id + 1) / (size_t)g_threads;
  uint64_t sum = 0;
  for (size_t i = begin; i < end; ++i) {
    sum += mix(g_heap[i] + i);
    g_heap[i] = sum;
  }
  g_sums[id] = sum;
  return NULL;
}

int main(int argc, char** argv) {
  long mib = 100;
  for (int i = 1; i < argc; ++i) {
    if (!strncmp(argv[i], "--mib=", 6)) {
      mib = atol(argv[i] + 6);
    } else if (!strncmp(argv[i], "--threads=", 10)) {
      g_threads = atoi(argv[i] + 10);
    } else {
      fprintf(stderr, "usage: %s [--mib=N] [--threads=N]\n", argv[0]);
      return 2;
    }
  }
  if (mib < 1 || mib > 65536 || g_threads < 1 || g_threads > 64) {
    fprintf(stderr, "--mib must be 1..65536 and --threads 1..64\n");
    return 2;
  }
  g_words = (size_t)mib << 17; /* 8-byte words per MiB: 2^20 / 8 */
  g_heap = malloc(g_words * sizeof(uint64_t));
  if (g_heap == NULL) {
    fprintf(stderr, "cannot allocate %ld MiB\n", mib);
    return 1;
  }
  uint64_t before = 0;
  for (size_t i = 0; i < g_words; ++i) {
    g_heap[i] = mix(i * 0x9e3779b97f4a7c15ULL);
    before ^= g_heap[i];
  }
  pthread_t t[64];
  for (long i = 0; i < g_threads; ++i) {
    if (pthread_create(&t[i], NULL, worker, (void*)i) != 0) return 1;
  }
  for (int i = 0; i < g_threads; ++i) pthread_join(t[i], NULL);
  uint64_t after = 0;
  for (int i = 0; i < g_threads; ++i) after = mix(after ^ g_sums[i]);
  for (size_t i = 0; i < g_words; i += 4096) after = mix(after ^ g_heap[i]);
  printf("mib=%ld before=%016llx after=%016llx\n", mib, (unsigned long long)before,
         (unsigned long long)after);
  return 0;
}
