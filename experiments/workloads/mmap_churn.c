/* Address-space churn: --threads workers (default 2), started together behind a start gate
 * that main opens after a 100 ms timed wait, each map and unmap a 64 KiB anonymous region
 * --size times (default 200), touching its first page. Measures what an address-space change
 * costs: under `stretchd run` every mmap and munmap is made cluster-wide.
 *
 *   mmap_churn [--threads=N] [--size=CALLS]
 *
 * Prints "mmap_churn: threads=<n> calls=<c> sum=<s>" (the same natively and under stretchd
 * run), and to stderr "time_ms compute <ms>" and "us_per_call <us>". */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "common.h"

static int g_gate;
static long g_calls = 200;
static long g_sum[64];

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void* worker(void* p) {
  long id = (long)p, sum = 0;
  while (!__atomic_load_n(&g_gate, __ATOMIC_ACQUIRE)) sched_yield();
  for (long i = 0; i < g_calls; ++i) {
    unsigned char* m =
        mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      fprintf(stderr, "mmap: %s\n", strerror(errno));
      exit(1);
    }
    m[0] = (unsigned char)(i + id);
    sum += m[0] + m[4096]; /* a written page and a fresh (zero) one */
    if (munmap(m, 65536) != 0) {
      fprintf(stderr, "munmap: %s\n", strerror(errno));
      exit(1);
    }
  }
  g_sum[id] = sum;
  return NULL;
}

int main(int argc, char** argv) {
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    if (!strncmp(argv[i], "--threads=", 10)) {
      threads = atoi(argv[i] + 10);
    } else if (!strncmp(argv[i], "--size=", 7)) {
      g_calls = atol(argv[i] + 7);
    } else {
      fprintf(stderr, "unknown argument '%s'\nusage: %s [--threads=N] [--size=CALLS]\n", argv[i],
              argv[0]);
      return 2;
    }
  }
  if (threads < 1 || threads > 64 || g_calls < 1) {
    fprintf(stderr, "--threads must be 1..64 and --size positive\n");
    return 2;
  }
  pthread_t t[64];
  for (long i = 0; i < threads; ++i) pthread_create(&t[i], NULL, worker, (void*)i);
  wl_timed_wait_ms(100); /* the migration point of stretchd run, every worker alive */
  double start = now_ms();
  __atomic_store_n(&g_gate, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < threads; ++i) pthread_join(t[i], NULL);
  double ms = now_ms() - start;
  long sum = 0;
  for (int i = 0; i < threads; ++i) sum += g_sum[i];
  printf("mmap_churn: threads=%d calls=%ld sum=%ld\n", threads, g_calls, sum);
  fprintf(stderr, "time_ms compute %.3f\nus_per_call %.1f\n", ms,
          ms * 1000.0 / (2.0 * (double)g_calls));
  return 0;
}
