/* Two phases with opposite needs. Phase 1: every worker adds to counters on 64 shared pages in
 * turn, a little work between additions (all threads write all the pages: distributed, nearly
 * every addition waits for a page from another node).
 * Phase 2: every worker computes on its own (no sharing at all: distributed, every node's
 * cores help). A placement decided once is wrong for one of them; adaptive placement
 * (`stretchd run --placement=adaptive`) consolidates in phase 1 and spreads again in phase 2.
 *
 *   phases [--threads=4] [--shared=200000] [--compute=400000000] [--start_ms=0]
 *
 * --shared: additions per worker in phase 1 (each after 20000 generator steps); --compute: generator steps per worker in phase 2;
 * --start_ms: the workers sleep this long first (so that `stretchd run` migrates them, at its
 * default point, main in pthread_join, before phase 1 starts).
 * Prints the counter and each worker's result, the same natively and under stretchd run, and
 * each phase's time on stderr as "time_ms <phase> <ms>". */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_THREADS 64

static struct {
  _Alignas(4096) uint64_t value;
} g_results[MAX_THREADS];
static long g_shared = 200000, g_compute = 400000000, g_start_ms = 0;
static int g_threads = 4;
static pthread_barrier_t g_barrier;
#define SHARED_PAGES 64
static struct {
  _Alignas(4096) uint64_t count;
} g_shared_pages[SHARED_PAGES];
static double g_phase_ms[3];

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void* worker(void* p) {
  const long id = (long)p;
  struct timespec start = {g_start_ms / 1000, (g_start_ms % 1000) * 1000000};
  while (nanosleep(&start, &start) != 0) {
  }
  pthread_barrier_wait(&g_barrier);
  if (id == 0) g_phase_ms[0] = now_ms();
  uint64_t y = (uint64_t)id;
  for (long i = 0; i < g_shared; ++i) {
    for (int w = 0; w < 20000; ++w) y = y * 6364136223846793005ull + 1;  /* a little work */
    __atomic_fetch_add(&g_shared_pages[(i * 7 + id) % SHARED_PAGES].count, 1 + (y >> 63),
                       __ATOMIC_RELAXED);
  }
  pthread_barrier_wait(&g_barrier);
  if (id == 0) g_phase_ms[1] = now_ms();
  uint64_t x = (uint64_t)id + 1;
  for (long i = 0; i < g_compute; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
  g_results[id].value = x;
  pthread_barrier_wait(&g_barrier);
  if (id == 0) g_phase_ms[2] = now_ms();
  return NULL;
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!strncmp(argv[i], "--threads=", 10)) {
      g_threads = atoi(argv[i] + 10);
    } else if (!strncmp(argv[i], "--shared=", 9)) {
      g_shared = atol(argv[i] + 9);
    } else if (!strncmp(argv[i], "--compute=", 10)) {
      g_compute = atol(argv[i] + 10);
    } else if (!strncmp(argv[i], "--start_ms=", 11)) {
      g_start_ms = atol(argv[i] + 11);
    } else {
      fprintf(stderr, "usage: %s [--threads=N] [--shared=N] [--compute=N] [--start_ms=N]\n",
              argv[0]);
      return 2;
    }
  }
  if (g_threads < 1 || g_threads > MAX_THREADS || g_shared < 0 || g_compute < 0 ||
      g_start_ms < 0) {
    fprintf(stderr, "--threads must be 1..%d; --shared, --compute, --start_ms >= 0\n",
            MAX_THREADS);
    return 2;
  }
  pthread_barrier_init(&g_barrier, NULL, (unsigned)g_threads);
  pthread_t t[MAX_THREADS];
  for (long i = 0; i < g_threads; ++i) {
    if (pthread_create(&t[i], NULL, worker, (void*)i) != 0) {
      fprintf(stderr, "pthread_create failed\n");
      return 1;
    }
  }
  for (int i = 0; i < g_threads; ++i) pthread_join(t[i], NULL);
  fprintf(stderr, "time_ms shared %.1f\ntime_ms compute %.1f\n", g_phase_ms[1] - g_phase_ms[0],
          g_phase_ms[2] - g_phase_ms[1]);
  uint64_t counter = 0;
  for (int i = 0; i < SHARED_PAGES; ++i) counter += g_shared_pages[i].count;
  printf("counter %llu\n", (unsigned long long)counter);
  for (int i = 0; i < g_threads; ++i) {
    printf("worker %d result %llu\n", i, (unsigned long long)g_results[i].value);
  }
  return 0;
}
