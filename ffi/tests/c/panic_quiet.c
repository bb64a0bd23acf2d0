/*
 * Calls shmsched_debug_panic (a deliberate panic inside the library) and
 * prints the status and the thread's message on stdout. The library must
 * print nothing on stderr: ffi/tests/status_codes.rs checks that this
 * program's stderr is empty.
 */
#include <stdio.h>

#include "shmsched.h"

int main(void) {
  shmsched_status st = shmsched_debug_panic();
  char msg[1024];
  shmsched_last_error_message(msg, sizeof msg);
  printf("status %u\nmessage %s\n", (unsigned)st, msg);
  /* A second panic behaves the same (the hook is installed once). */
  st = shmsched_debug_panic();
  printf("again %u\n", (unsigned)st);
  return st == SHMSCHED_STATUS_INTERNAL ? 0 : 1;
}
