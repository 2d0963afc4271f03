/* Loads libraries after the migration point, as real programs do: two workers compute, then
 * end with pthread_exit (glibc dlopens libgcc_s for it on first use), while main, having
 * joined them, dlopens zlib and calls into it (its text, rodata and data are file mappings
 * made then). Prints the workers' results and a CRC-32 from zlib.
 * Usage: dlopen_after [ITERATIONS]. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static long iterations = 300000000L;
static unsigned long results[2];

static void* worker(void* arg) {
  const long k = (long)arg;
  unsigned long s = 0;
  for (long i = 0; i < iterations; i++) s = s * 6364136223846793005UL + (unsigned long)(i ^ k);
  results[k] = s;
  pthread_exit(NULL);
}

int main(int argc, char** argv) {
  if (argc > 1) iterations = atol(argv[1]);
  pthread_t t[2];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, (void*)i);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  void* z = dlopen("libz.so.1", RTLD_NOW);
  if (z == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  unsigned long (*crc32)(unsigned long, const unsigned char*, unsigned) =
      (unsigned long (*)(unsigned long, const unsigned char*, unsigned))dlsym(z, "crc32");
  const char* (*version)(void) = (const char* (*)(void))dlsym(z, "zlibVersion");
  if (crc32 == NULL || version == NULL) return 1;
  static unsigned char buf[1 << 20];
  for (size_t i = 0; i < sizeof(buf); i++) buf[i] = (unsigned char)(results[i & 1] >> (i % 56));
  printf("%lu %lu crc %lx zlib %s\n", results[0], results[1], crc32(0, buf, sizeof(buf)),
         version());
  dlclose(z);
  return 0;
}
