/* Shared harness for the Stretch workloads: plain pthread programs in the style of Phoenix's
 * pthread applications. Each program generates its input deterministically from --seed and
 * --size, runs its phases on a long-lived worker pool (or, with --per_phase, on threads created
 * and joined for every phase, as some Phoenix pthread versions do), prints its result to stdout
 * (identical for a given input and thread count, whatever the machine) and its phase times to
 * stderr as "time_ms <phase> <ms>".
 *
 * Flags: --threads=N (default: online CPUs, as Phoenix sizes its pool), --size=N (problem size,
 * meaning per program), --seed=N, --iterations=N (where iterative), --pin (pin worker i to CPU
 * i % configured CPUs with sched_setaffinity at every phase, aborting if that fails, as
 * Phoenix's runtime does), --per_phase, --manual (for `stretchd run --manual`: wl_alloc maps
 * MAP_SHARED anonymous memory, the only kind shared between nodes in manual mode, and the
 * pool's mutex and condition variables each get a page of their own; k-means and matrix
 * multiply support it).
 *
 * Built with -fopenmp (the `<name>_omp` targets), the pool is libgomp's: each phase is a
 * `#pragma omp parallel num_threads(threads)` region in which the main thread works as thread
 * 0, and --per_phase and --manual are refused (exit 2). Output is the same as the pthread
 * build's. */
#ifndef STRETCH_EXPERIMENTS_WORKLOADS_COMMON_H_
#define STRETCH_EXPERIMENTS_WORKLOADS_COMMON_H_

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int threads;
  long size;
  uint64_t seed;
  int iterations;
  int pin;
  int per_phase;
  int manual;
} wl_args;

/* Parses the flags above; exits 2 with a message on a bad flag. */
void wl_parse(int argc, char** argv, wl_args* a, long default_size, int default_iterations,
              const char* usage);

/* splitmix64: a small deterministic generator. */
static inline uint64_t wl_rand(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double wl_now_ms(void);
/* Waits `ms` milliseconds in a timed condition wait (a futex): how test programs give
 * `stretchd run` its default migration point (main blocked in a futex) while their workers
 * exist. */
void wl_timed_wait_ms(long ms);
void wl_report_time(const char* phase, double start_ms);

typedef void (*wl_task)(int worker, int nworkers, void* arg);

typedef struct wl_pool wl_pool;
/* Starts `n` workers that wait for phases (mutex + condition variables). */
wl_pool* wl_pool_start(const wl_args* a);
/* Runs task(i, n, arg) on every worker i and returns when all are done. */
void wl_pool_run(wl_pool* p, wl_task task, void* arg);
/* Stops and joins the workers. */
void wl_pool_stop(wl_pool* p);

/* Runs one phase either on the pool or on fresh threads (--per_phase). */
void wl_phase(const wl_args* a, wl_pool* p, wl_task task, void* arg);

/* The [begin, end) slice of `total` items for worker i of n. */
static inline void wl_slice(long total, int i, int n, long* begin, long* end) {
  *begin = total * i / n;
  *end = total * (i + 1) / n;
}

/* malloc (with --manual: a MAP_SHARED anonymous mapping) that exits with a message on failure;
 * wl_free gives it back. */
void* wl_alloc(size_t bytes);
void wl_free(void* p);

#endif
