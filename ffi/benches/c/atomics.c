/*
 * The atomic skeleton of one acquire + release pair, without the library:
 * what the C pair's cost is made of, measured beside it by
 * benches/ffi_pair.rs.
 *
 *   cas2   the library's own pair: CAS(cell, free -> owner), then
 *          CAS(cell, owner -> free).
 *   table  the same plus what the C ABI's checked-permit table adds
 *          (src/permits.rs, still the path of weighted permits and
 *          children): the entry published HELD (a release store), claimed
 *          on release by CAS(HELD -> RELEASING), stored FREE after the
 *          give-back.
 *   token  the same pair plus what a cell token adds (src/pin.rs): the
 *          tag stored into the cell after the take (a plain store), and
 *          on release the pin (load the slot, store the hazard, compiler
 *          fence, load the slot again), the give-back CAS from the tagged
 *          value, the hazard cleared (a release store).
 *
 * The ratio table / cas2 is the floor of any release check that claims
 * an entry of its own with an atomic read-modify-write; token / cas2 is
 * the floor of the check carried by the cell's own give-back CAS.
 *
 * usage: atomics cas2|table|token ITERS ROUNDS  ->  prints "ns_per_pair <median>"
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Each word on its own cache line, as the cell, the entry, the pin slot
 * and the hazard record are. */
static _Alignas(128) _Atomic uint64_t cell;
static _Alignas(128) _Atomic uint64_t entry;
static _Alignas(128) _Atomic(void *) slot;
static _Alignas(128) _Atomic(void *) hazard;
static int handle;

enum { FREE = 0, HELD = 1, RELEASING = 2, OWNER = 0x10001 };

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

__attribute__((noinline)) static long cas2(long n) {
  long failed = 0;
  for (long i = 0; i < n; i++) {
    uint64_t e = FREE;
    failed += !atomic_compare_exchange_strong(&cell, &e, OWNER);
    e = OWNER;
    failed += !atomic_compare_exchange_strong(&cell, &e, FREE);
  }
  return failed;
}

__attribute__((noinline)) static long token(long n) {
  long failed = 0;
  for (long i = 0; i < n; i++) {
    uint64_t tag = (uint64_t)(uint32_t)(i | 1) << 32;
    uint64_t e = FREE;
    failed += !atomic_compare_exchange_strong(&cell, &e, OWNER);
    atomic_store_explicit(&cell, tag | OWNER, memory_order_release);
    void *h = atomic_load_explicit(&slot, memory_order_acquire);
    atomic_store_explicit(&hazard, h, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst);
    failed += atomic_load_explicit(&slot, memory_order_acquire) != h;
    e = tag | OWNER;
    failed += !atomic_compare_exchange_strong(&cell, &e, FREE);
    atomic_store_explicit(&hazard, NULL, memory_order_release);
  }
  return failed;
}

__attribute__((noinline)) static long table(long n) {
  long failed = 0;
  for (long i = 0; i < n; i++) {
    uint64_t e = FREE;
    failed += !atomic_compare_exchange_strong(&cell, &e, OWNER);
    atomic_store_explicit(&entry, HELD, memory_order_release);
    uint64_t h = HELD;
    failed += !atomic_compare_exchange_strong(&entry, &h, RELEASING);
    e = OWNER;
    failed += !atomic_compare_exchange_strong(&cell, &e, FREE);
    atomic_store_explicit(&entry, FREE, memory_order_release);
  }
  return failed;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  long iters = argc > 2 ? atol(argv[2]) : 1000000;
  int rounds = argc > 3 ? atoi(argv[3]) : 9;
  long (*run)(long) = strcmp(mode, "cas2") == 0    ? cas2
                      : strcmp(mode, "table") == 0 ? table
                      : strcmp(mode, "token") == 0 ? token
                                                   : NULL;
  if (run == NULL || iters <= 0 || rounds <= 0 || rounds > 99) {
    fprintf(stderr, "usage: atomics cas2|table|token ITERS ROUNDS\n");
    return 2;
  }
  atomic_store(&slot, &handle);
  double per[99];
  for (int r = 0; r < rounds; r++) {
    double t0 = now_ns();
    if (run(iters) != 0) {
      fprintf(stderr, "a CAS failed uncontended\n");
      return 1;
    }
    per[r] = (now_ns() - t0) / (double)iters;
  }
  qsort(per, (size_t)rounds, sizeof per[0], cmp);
  printf("ns_per_pair %.2f\n", per[rounds / 2]);
  return 0;
}
