/* Threads use a file that main opened before the migration point: one descriptor, one file
 * offset. Main reads the file's first 16 bytes (write: makes the file anew and writes them),
 * starts two workers and joins them; each worker
 * computes, then, by mode:
 *   read   reads 64 bytes with read() (the shared offset), twice
 *   pread  reads 64 bytes with pread() at its own offset
 *   write  writes 64 bytes of its own letter with write(), then 64 more with writev()
 *   seek   moves the offset 64 bytes on with lseek(SEEK_CUR), then reads 64 bytes, both
 *          under a mutex (without it, which bytes each reads depends on how the two calls of
 *          each interleave: seek, seek, read, read reads other bytes than seek, read, ...)
 * and main prints what they read, the offset (lseek) and, for write, what the file holds
 * past the first 16 bytes. Usage: shared_fd FILE read|pread|write|seek. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

static volatile unsigned long spin;
static int fd;
static const char* mode;
static long got[2];
static unsigned long sums[2];
static pthread_mutex_t seek_lock = PTHREAD_MUTEX_INITIALIZER;

static void* worker(void* arg) {
  const long k = (long)arg;
  for (long i = 0; i < 300000000L; i++) spin += (unsigned long)i;
  unsigned char buf[64];
  if (strcmp(mode, "write") == 0) {
    memset(buf, 'a' + (int)k, sizeof(buf));
    got[k] = write(fd, buf, sizeof(buf));
    struct iovec v[2] = {{buf, 32}, {buf, 32}};
    got[k] += writev(fd, v, 2);
    return NULL;
  }
  const int seek = strcmp(mode, "seek") == 0;
  if (seek) pthread_mutex_lock(&seek_lock);
  if (seek && lseek(fd, 64, SEEK_CUR) < 0) {
    pthread_mutex_unlock(&seek_lock);
    return NULL;
  }
  const int reads = strcmp(mode, "read") == 0 ? 2 : 1;
  for (int r = 0; r < reads; r++) {
    const long n = strcmp(mode, "pread") == 0 ? pread(fd, buf, sizeof(buf), 16 + k * 64)
                                              : read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    got[k] += n;
    for (long i = 0; i < n; i++) sums[k] += buf[i];
  }
  if (seek) pthread_mutex_unlock(&seek_lock);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: shared_fd FILE read|pread|write|seek\n");
    return 2;
  }
  mode = argv[2];
  const int writing = strcmp(mode, "write") == 0;
  /* write: the file is made anew, its 16-byte head written by main. */
  fd = writing ? open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644) : open(argv[1], O_RDONLY);
  char head[16] = "0123456789abcde";
  if (fd < 0 || (writing ? write(fd, head, sizeof(head)) : read(fd, head, sizeof(head))) !=
                    (ssize_t)sizeof(head)) {
    perror(argv[1]);
    return 1;
  }
  pthread_t t[2];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, (void*)i);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  printf("%ld bytes, sum %lu, offset %ld\n", got[0] + got[1], sums[0] + sums[1],
         (long)lseek(fd, 0, SEEK_CUR));
  if (strcmp(mode, "write") == 0) {
    char back[256];
    const ssize_t n = pread(fd, back, sizeof(back), 16);
    /* Natively each call's bytes are in place, one call after another: whatever the order, 128
     * of each letter, in runs whose lengths are multiples of 32. */
    int letters[2] = {0, 0}, in_place = 1;
    ssize_t run = 0;
    for (ssize_t i = 0; i < n; i++) {
      if (back[i] == 'a' || back[i] == 'b') letters[back[i] - 'a']++;
      if (i > 0 && back[i] != back[i - 1]) {
        if (run % 32 != 0) in_place = 0;
        run = 0;
      }
      run++;
    }
    if (run % 32 != 0) in_place = 0;
    printf("after the head: %zd bytes, %d a, %d b, %s\n", n, letters[0], letters[1],
           in_place ? "every write in place" : "writes overlap");
  }
  return 0;
}
