/* The corpus's OpenBLAS program (ours, calling Debian's threaded OpenBLAS): reads two N x N
 * matrices from a file, computes C = A x B with cblas_dgemm --reps times (C += A x B), and
 * prints checksums of C.
 *
 *   dgemm FILE [--reps=R]
 *
 * FILE: a little-endian int64 N, then A and B, row-major doubles (gen_inputs.py writes it).
 * The generator's entries are multiples of 1/64 in [-1, 1], so every product and partial sum is
 * exact in a double and C is the same whatever the order of OpenBLAS's sums (and so whatever
 * the thread count): the checksums are printed exactly. Which libopenblas was loaded and how
 * many threads it uses go to stderr (OPENBLAS_NUM_THREADS sets the count). */
#define _GNU_SOURCE
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openblas-pthread/cblas.h>

static int report_openblas(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  (void)data;
  if (strstr(info->dlpi_name, "openblas") != NULL) fprintf(stderr, "loaded %s\n", info->dlpi_name);
  return 0;
}

static void read_all(FILE* f, void* p, size_t bytes, const char* path) {
  if (fread(p, 1, bytes, f) != bytes) {
    fprintf(stderr, "%s: short read (want %zu bytes)\n", path, bytes);
    exit(1);
  }
}

int main(int argc, char** argv) {
  const char* path = NULL;
  long reps = 1;
  for (int i = 1; i < argc; ++i) {
    if (!strncmp(argv[i], "--reps=", 7)) {
      char* end;
      reps = strtol(argv[i] + 7, &end, 10);
      if (*end || reps < 1) {
        fprintf(stderr, "bad --reps: %s\n", argv[i]);
        return 2;
      }
    } else if (path == NULL && argv[i][0] != '-') {
      path = argv[i];
    } else {
      fprintf(stderr, "usage: %s FILE [--reps=R]\n", argv[0]);
      return 2;
    }
  }
  if (path == NULL) {
    fprintf(stderr, "usage: %s FILE [--reps=R]\n", argv[0]);
    return 2;
  }
  FILE* f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "open %s: %s\n", path, strerror(errno));
    return 1;
  }
  int64_t n;
  read_all(f, &n, sizeof(n), path);
  if (n < 1 || n > 20000) {
    fprintf(stderr, "%s: bad matrix size %lld\n", path, (long long)n);
    return 1;
  }
  size_t elems = (size_t)n * (size_t)n;
  double* a = malloc(elems * sizeof(double));
  double* b = malloc(elems * sizeof(double));
  double* c = calloc(elems, sizeof(double));
  if (a == NULL || b == NULL || c == NULL) {
    fprintf(stderr, "out of memory for three %lld x %lld matrices\n", (long long)n, (long long)n);
    return 1;
  }
  read_all(f, a, elems * sizeof(double), path);
  read_all(f, b, elems * sizeof(double), path);
  fclose(f);

  dl_iterate_phdr(report_openblas, NULL);
  fprintf(stderr, "openblas: %s, %d threads\n", openblas_get_config(), openblas_get_num_threads());
  for (long r = 0; r < reps; ++r) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0, a,
                (int)n, b, (int)n, 1.0, c, (int)n);
  }
  double sum = 0, weighted = 0, maxabs = 0;
  for (size_t i = 0; i < elems; ++i) {
    sum += c[i];
    weighted += c[i] * (double)(i % 7 + 1);
    if (c[i] > maxabs || -c[i] > maxabs) maxabs = c[i] < 0 ? -c[i] : c[i];
  }
  printf("n=%lld reps=%ld sum=%.17g weighted=%.17g max|c|=%.17g c[0][0]=%.17g c[n-1][n-1]=%.17g\n",
         (long long)n, reps, sum, weighted, maxabs, c[0], c[elems - 1]);
  free(a);
  free(b);
  free(c);
  return 0;
}
