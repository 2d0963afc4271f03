/* Blocked LU (in the style of HPL's right-looking factorization): A = L U of an N x N
 * diagonally dominant matrix of doubles (so no pivoting is needed), in place, in blocks of
 * B x B. For each block step k: main factors the diagonal block; the workers solve the panel
 * (the blocks below it for L, right of it for U); then the workers update the trailing matrix,
 * A[i][j] -= L[i][k] U[k][j], each owning the block columns j = worker (mod workers) as in a
 * block-cyclic distribution. Row-major, page-aligned storage: a block's row is 8 B bytes, so
 * blocks narrower than a page (B < 512) put several owners' columns on each page, and blocks of
 * 512 or more fill whole pages of their own.
 * Every element is computed in the same order whatever the thread count, so the result is
 * identical for any --threads. --size = N, --block = B (N a multiple of B). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct {
  double* a;
  long n, b, nb;
  long k; /* the current block step */
} job;

static double* blk(job* j, long bi, long bj) { return j->a + bi * j->b * j->n + bj * j->b; }

/* Unblocked LU of the diagonal block in place (unit lower L, upper U). */
static void factor_diagonal(job* j) {
  double* d = blk(j, j->k, j->k);
  long b = j->b, n = j->n;
  for (long p = 0; p < b; ++p) {
    for (long i = p + 1; i < b; ++i) {
      d[i * n + p] /= d[p * n + p];
      const double l = d[i * n + p];
      for (long c = p + 1; c < b; ++c) d[i * n + c] -= l * d[p * n + c];
    }
  }
}

/* The panel: L[i][k] = A[i][k] U[k][k]^-1 for the blocks below (dealt round-robin), and
 * U[k][j] = L[k][k]^-1 A[k][j] for the blocks to the right, each by the owner of column j. */
static void solve_panel(int w, int nw, void* p) {
  job* j = p;
  const long b = j->b, n = j->n, k = j->k, rest = j->nb - k - 1;
  const double* d = blk(j, k, k);
  for (long t = 0; t < 2 * rest; ++t) {
    if (t < rest ? t % nw != w : (k + 1 + t - rest) % nw != w) continue;
    if (t < rest) {
      double* x = blk(j, k + 1 + t, k); /* X U = A: column by column */
      for (long r = 0; r < b; ++r) {
        for (long c = 0; c < b; ++c) {
          double v = x[r * n + c];
          for (long q = 0; q < c; ++q) v -= x[r * n + q] * d[q * n + c];
          x[r * n + c] = v / d[c * n + c];
        }
      }
    } else {
      double* x = blk(j, k, k + 1 + (t - rest)); /* L X = A, L unit lower: row by row */
      for (long r = 1; r < b; ++r) {
        for (long q = 0; q < r; ++q) {
          const double l = d[r * n + q];
          for (long c = 0; c < b; ++c) x[r * n + c] -= l * x[q * n + c];
        }
      }
    }
  }
}

/* The trailing matrix: A[i][j] -= L[i][k] U[k][j] for i, j > k; worker w owns the block
 * columns j with j % nw == w. */
static void update_trailing(int w, int nw, void* p) {
  job* j = p;
  const long b = j->b, n = j->n, k = j->k;
  for (long bj = k + 1; bj < j->nb; ++bj) {
    if (bj % nw != w) continue;
    const double* u = blk(j, k, bj);
    for (long bi = k + 1; bi < j->nb; ++bi) {
      const double* l = blk(j, bi, k);
      double* x = blk(j, bi, bj);
      for (long r = 0; r < b; ++r) {
        for (long q = 0; q < b; ++q) {
          const double lv = l[r * n + q];
          for (long c = 0; c < b; ++c) x[r * n + c] -= lv * u[q * n + c];
        }
      }
    }
  }
}

int main(int argc, char** argv) {
  /* --block=B is this program's own flag; the harness parses the rest. */
  long block = 64;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (!strncmp(argv[i], "--block=", 8)) {
      char* end = NULL;
      block = strtol(argv[i] + 8, &end, 10);
      if (*end != '\0' || block < 1) {
        fprintf(stderr, "--block must be a positive integer, not '%s'\n", argv[i] + 8);
        return 2;
      }
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  wl_args a;
  wl_parse(argc, argv, &a, 1024, 1,
           "[--threads=N] [--size=N] [--block=B] [--seed=N] [--pin] [--per_phase]");
  if (a.size % block != 0) {
    fprintf(stderr, "--size (%ld) must be a multiple of --block (%ld)\n", a.size, block);
    return 2;
  }
  double t0 = wl_now_ms();
  job* j = wl_alloc(sizeof(job));
  j->n = a.size;
  j->b = block;
  j->nb = a.size / block;
  /* Page-aligned, as HPL-style codes align their matrices: a block row of 512 doubles is then
   * exactly one page. */
  void* mem = NULL;
  if (posix_memalign(&mem, 4096, sizeof(double) * (size_t)(j->n * j->n)) != 0) {
    fprintf(stderr, "blocked_lu: out of memory for a %ld x %ld matrix\n", j->n, j->n);
    return 1;
  }
  j->a = mem;
  uint64_t s = a.seed;
  for (long r = 0; r < j->n; ++r) {
    for (long c = 0; c < j->n; ++c) {
      j->a[r * j->n + c] = (double)(wl_rand(&s) % 1000) / 1000.0;
    }
    j->a[r * j->n + r] += (double)j->n; /* diagonally dominant: stable without pivoting */
  }
  wl_report_time("generate", t0);

  wl_pool* pool = a.per_phase ? NULL : wl_pool_start(&a);
  double t1 = wl_now_ms();
  for (j->k = 0; j->k < j->nb; ++j->k) {
    factor_diagonal(j);
    if (j->k + 1 < j->nb) {
      wl_phase(&a, pool, solve_panel, j);
      wl_phase(&a, pool, update_trailing, j);
    }
  }
  wl_report_time("compute", t1);
  wl_pool_stop(pool);

  double sum = 0, diag = 0;
  unsigned long long hash = 1469598103934665603ull;
  for (long i = 0; i < j->n * j->n; ++i) {
    unsigned long long bits;
    memcpy(&bits, &j->a[i], sizeof(bits));
    hash = (hash ^ bits) * 1099511628211ull;
    sum += j->a[i];
  }
  for (long r = 0; r < j->n; ++r) diag += j->a[r * j->n + r];
  /* Check: (L U)[r][c] against the input, regenerated from the seed, on a sample of entries. */
  double residual = 0;
  const long n = j->n;
  uint64_t pick = 7;
  for (int t = 0; t < 64; ++t) {
    const long r = (long)(wl_rand(&pick) % (uint64_t)n), c = (long)(wl_rand(&pick) % (uint64_t)n);
    uint64_t g = a.seed;
    double orig = 0;
    for (long i = 0; i <= r * n + c; ++i) orig = (double)(wl_rand(&g) % 1000) / 1000.0;
    if (r == c) orig += (double)n;
    double lu = 0;
    for (long q = 0; q <= (r < c ? r : c); ++q) {
      lu += (q == r ? 1.0 : j->a[r * n + q]) * j->a[q * n + c];
    }
    const double e = (lu - orig) < 0 ? orig - lu : lu - orig;
    if (e > residual) residual = e;
  }
  printf("n=%ld block=%ld sum=%.12e diag=%.12e hash=%016llx residual=%s\n", j->n, j->b, sum, diag,
         hash, residual < 1e-9 * (double)n ? "small" : "LARGE");
  free(j->a);
  wl_free(j);
  return 0;
}
