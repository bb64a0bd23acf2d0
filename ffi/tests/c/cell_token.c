/*
 * ffi/tests/cell_token.rs: one-slot permits of a shared handle are cell
 * tokens (serial bit 63), released once, checked by the slot's own
 * give-back CAS. Prints "FAIL ..." lines for what went wrong and "done"
 * at the end; exits 0 only if nothing failed.
 *
 *   - a double release: ALREADY_RELEASED, and the slot is not freed again
 *     for the next holder;
 *   - garbage tokens (random serials with bit 63 set, this process's tag):
 *     ALREADY_RELEASED, never a crash, never a free;
 *   - a weighted permit and a child's permit are table tokens (bit 63 clear);
 *   - a permit released after its handle was closed frees its slot;
 *   - max 1 and max 65536: the slot numbered 65535 round-trips;
 *   - a forked child cannot release its parent's token (FOREIGN_PERMIT) and
 *     the parent's slot stays held; the parent releases it afterwards.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shmsched.h"

static int failures;

#define CHECK(cond, ...)                  \
  do {                                    \
    if (!(cond)) {                        \
      printf("FAIL line %d: ", __LINE__); \
      printf(__VA_ARGS__);                \
      printf("\n");                       \
      failures++;                         \
    }                                     \
  } while (0)

static void must(shmsched_status st, const char *what) {
  if (st != SHMSCHED_STATUS_OK) {
    char msg[512];
    shmsched_last_error_message(msg, sizeof msg);
    printf("FAIL %s: %s (%s)\n", what, shmsched_strerror(st), msg);
    fflush(stdout);
    exit(1);
  }
}

static uint32_t running(shmsched_scheduler *s) {
  uint32_t n = 0;
  must(shmsched_scheduler_global_running(s, &n), "global_running");
  return n;
}

static shmsched_scheduler *shared(shmsched_region **r, uint32_t max) {
  shmsched_scheduler *s;
  must(shmsched_region_anonymous(0, r), "region_anonymous");
  must(shmsched_scheduler_shared(*r, max, &s), "scheduler_shared");
  return s;
}

static const uint64_t CELL_TOKEN = (uint64_t)1 << 63;

int main(void) {
  shmsched_region *r;
  shmsched_scheduler *s = shared(&r, 2);
  shmsched_permit a, b;

  /* Double release. */
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &a), "acquire");
  CHECK(a.serial & CELL_TOKEN, "a one-slot permit is a cell token: %#llx",
        (unsigned long long)a.serial);
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "first release");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_ALREADY_RELEASED, "second release");
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &b), "acquire b");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_ALREADY_RELEASED, "stale release");
  CHECK(running(s) == 1, "b still held: running %u", running(s));

  /* Garbage. */
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 100000; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    shmsched_permit g = {b.process, x | CELL_TOKEN};
    if (g.serial == b.serial) continue;
    shmsched_status st = shmsched_permit_release(g);
    if (st != SHMSCHED_STATUS_ALREADY_RELEASED) {
      CHECK(0, "garbage serial %#llx: %s", (unsigned long long)g.serial, shmsched_strerror(st));
      break;
    }
  }
  CHECK(running(s) == 1, "garbage freed nothing: running %u", running(s));
  CHECK(shmsched_permit_release(b) == SHMSCHED_STATUS_OK, "release b");

  /* Weighted and child permits are table tokens. */
  shmsched_permit m, c;
  must(shmsched_scheduler_acquire_many(s, SHMSCHED_PRIORITY_NORMAL, 2, &m), "acquire_many");
  CHECK(!(m.serial & CELL_TOKEN), "a weighted permit is a table token");
  CHECK(shmsched_permit_release(m) == SHMSCHED_STATUS_OK, "release m");
  shmsched_scheduler *child;
  must(shmsched_scheduler_child(s, 1, &child), "child");
  must(shmsched_scheduler_acquire(child, SHMSCHED_PRIORITY_NORMAL, &c), "acquire child");
  CHECK(!(c.serial & CELL_TOKEN), "a child's permit is a table token");
  CHECK(shmsched_permit_release(c) == SHMSCHED_STATUS_OK, "release c");
  CHECK(shmsched_permit_release(c) == SHMSCHED_STATUS_ALREADY_RELEASED, "release c again");
  shmsched_scheduler_close(child);

  /* Released after close: frees its slot (counted through a second handle). */
  shmsched_scheduler *other;
  must(shmsched_scheduler_attach(r, &other), "attach");
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &a), "acquire a");
  shmsched_scheduler_close(s);
  CHECK(running(other) == 1, "held across the close");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "release after close");
  CHECK(running(other) == 0, "freed after close: running %u", running(other));
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_ALREADY_RELEASED, "again after close");

  /* Fork: the child cannot release the parent's token. */
  must(shmsched_scheduler_acquire(other, SHMSCHED_PRIORITY_NORMAL, &a), "acquire for fork");
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int code = shmsched_permit_release(a) == SHMSCHED_STATUS_FOREIGN_PERMIT ? 0 : 7;
    _exit(code);
  }
  int wst = 0;
  waitpid(pid, &wst, 0);
  CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "the child got FOREIGN_PERMIT (status %d)", wst);
  CHECK(running(other) == 1, "the parent's slot stays held: running %u", running(other));
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "the parent releases it");
  shmsched_scheduler_close(other);
  shmsched_region_close(r);

  /* Max 1 and max 65536. */
  s = shared(&r, 1);
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &a), "acquire max 1");
  CHECK(((a.serial >> 32) & 0xffff) == 0, "max 1: slot 0");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "release max 1");
  shmsched_scheduler_close(s);
  shmsched_region_close(r);
  s = shared(&r, 65536);
  shmsched_permit *all = malloc(65536 * sizeof *all);
  int found = -1;
  for (int i = 0; i < 65536; i++) {
    must(shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_NORMAL, &all[i]), "try_acquire");
    if (((all[i].serial >> 32) & 0xffff) == 65535) found = i;
  }
  CHECK(found >= 0, "slot 65535 named by a token");
  CHECK(shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_NORMAL, &a) ==
            SHMSCHED_STATUS_WOULD_BLOCK,
        "full");
  for (int i = 0; i < 65536; i++) {
    CHECK(shmsched_permit_release(all[i]) == SHMSCHED_STATUS_OK, "release %d", i);
  }
  if (found >= 0) {
    CHECK(shmsched_permit_release(all[found]) == SHMSCHED_STATUS_ALREADY_RELEASED, "65535 again");
  }
  CHECK(running(s) == 0, "all free: running %u", running(s));
  free(all);
  shmsched_scheduler_close(s);
  shmsched_region_close(r);

  printf("done\n");
  return failures ? 1 : 0;
}
