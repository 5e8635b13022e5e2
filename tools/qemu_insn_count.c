/* Counts the guest instructions qemu-user executes: each translated block adds its instruction
   count to a counter every time it runs (inline, no callback). One counter for all threads: run
   the guest single-threaded for an exact count. Prints "insns N" to stderr at exit.
   With the plugin argument out=PATH it also counts each translated block's executions and writes
   one line per executed block to PATH at exit: "ADDRESS INSNS EXECUTIONS" (guest virtual address
   in hexadecimal, the block's instruction count, how many times it ran), for attributing the count
   to functions (bench/insn_per_token.py --profile). */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*tb_trans_cb)(qemu_plugin_id_t, struct qemu_plugin_tb*);
typedef void (*atexit_cb)(qemu_plugin_id_t, void*);
extern void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, tb_trans_cb);
extern size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb*);
extern uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb*);
extern void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb*, enum qemu_plugin_op, void*, uint64_t);
extern void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, atexit_cb, void*);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;
static uint64_t count;

/* Per-block counters (out=PATH only): each block's record is allocated once, so the address the
   inline add was given stays valid; a block translated again gets a record of its own. */
struct block { uint64_t vaddr, insns, execs; };
static struct block** blocks;
static size_t nblocks, cap;
static const char* out;

static void trans(qemu_plugin_id_t id, struct qemu_plugin_tb* tb) {
  (void)id;
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &count, qemu_plugin_tb_n_insns(tb));
  if (!out) return;
  if (nblocks == cap) {
    cap = cap ? 2 * cap : 1 << 16;
    blocks = realloc(blocks, cap * sizeof *blocks);
  }
  struct block* b = calloc(1, sizeof *b);
  if (!blocks || !b) abort();
  b->vaddr = qemu_plugin_tb_vaddr(tb);
  b->insns = qemu_plugin_tb_n_insns(tb);
  blocks[nblocks++] = b;
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &b->execs, 1);
}
static void done(qemu_plugin_id_t id, void* p) {
  (void)id; (void)p;
  if (out) {
    FILE* f = fopen(out, "w");
    if (f) {
      for (size_t i = 0; i < nblocks; ++i)
        if (blocks[i]->execs)
          fprintf(f, "%" PRIx64 " %" PRIu64 " %" PRIu64 "\n", blocks[i]->vaddr, blocks[i]->insns, blocks[i]->execs);
      fclose(f);
    }
  }
  fprintf(stderr, "insns %" PRIu64 "\n", count);
}
__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t* info, int argc, char** argv) {
  (void)info;
  for (int i = 0; i < argc; ++i)
    if (strncmp(argv[i], "out=", 4) == 0) out = strdup(argv[i] + 4);
  qemu_plugin_register_vcpu_tb_trans_cb(id, trans);
  qemu_plugin_register_atexit_cb(id, done, NULL);
  return 0;
}
