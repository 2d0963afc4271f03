/* For `stretchd migrate` tests: THREADS workers each compute ROUNDS rounds of floating-point
 * and integer work kept in registers (so a thread moved without its full register and FPU
 * state computes a different result), then wait, yielding, until main has seen the file
 * RELEASE exist. Prints each worker's results in order. With --manual, what the threads share
 * (the release flag, the results) is in a MAP_SHARED anonymous page, as `stretchd run --manual`
 * needs. With --exit, the workers also write their progress to the page main reads, and once
 * RELEASE exists main waits as many milliseconds as it holds (0 if none), prints "main exits"
 * and exits, the workers still computing (they end with it, as exit(3) ends every thread).
 *
 *   migrate_prog THREADS ROUNDS RELEASE [--manual | --exit] */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static long g_rounds;
static int g_exit;
static struct {
  int release;
  double fp[64];
  unsigned long hash[64];
} * g;

static void* worker(void* p) {
  long id = (long)p;
  double a = 1.0 + id, b = 0.5, c = 0.0;
  unsigned long h = 1469598103934665603ul ^ (unsigned long)id;
  for (long r = 0; r < g_rounds; ++r) {
    a = a * 1.0000001 + b;
    b = b * 0.9999999 - 1e-9 * a;
    c += a * b;
    h = (h ^ (unsigned long)r) * 1099511628211ul;
    if (g_exit && (r & 0xfffff) == 0) __atomic_store_n(&g->hash[id], h, __ATOMIC_RELAXED);
  }
  g->fp[id] = c;
  g->hash[id] = h;
  while (!__atomic_load_n(&g->release, __ATOMIC_ACQUIRE)) sched_yield();
  return NULL;
}

int main(int argc, char** argv) {
  const int manual = argc == 5 && strcmp(argv[4], "--manual") == 0;
  g_exit = argc == 5 && strcmp(argv[4], "--exit") == 0;
  if (argc != 4 && !manual && !g_exit) {
    fprintf(stderr, "usage: %s THREADS ROUNDS RELEASE [--manual | --exit]\n", argv[0]);
    return 2;
  }
  g = mmap(NULL, sizeof(*g), PROT_READ | PROT_WRITE,
           (manual ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS, -1, 0);
  if (g == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  int n = atoi(argv[1]);
  g_rounds = atol(argv[2]);
  if (n < 1 || n > 64 || g_rounds < 1) {
    fprintf(stderr, "THREADS must be 1..64, ROUNDS positive\n");
    return 2;
  }
  pthread_t t[64];
  for (long i = 0; i < n; ++i) pthread_create(&t[i], NULL, worker, (void*)i);
  unsigned long seen = 0;
  while (access(argv[3], F_OK) != 0) {
    usleep(10000);
    for (int i = 0; g_exit && i < n; ++i) seen ^= __atomic_load_n(&g->hash[i], __ATOMIC_RELAXED);
  }
  if (g_exit) {
    FILE* f = fopen(argv[3], "r");
    int ms = 0;
    if (f != NULL) {
      if (fscanf(f, "%d", &ms) != 1) ms = 0;
      fclose(f);
    }
    usleep(1000 * ms);
    printf("main exits\n");
    fflush(stdout);
    exit(seen == 1); /* 0: the read is only there to share the page */
  }
  __atomic_store_n(&g->release, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < n; ++i) pthread_join(t[i], NULL);
  for (int i = 0; i < n; ++i) printf("worker %d: %.17g %016lx\n", i, g->fp[i], g->hash[i]);
  return 0;
}
