/* Counts the guest instructions qemu-user executes: each translated block adds its instruction
   count to a counter every time it runs (inline, no callback). One counter for all threads: run
   the guest single-threaded for an exact count. Prints "insns N" to stderr at exit. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*tb_trans_cb)(qemu_plugin_id_t, struct qemu_plugin_tb*);
typedef void (*atexit_cb)(qemu_plugin_id_t, void*);
extern void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, tb_trans_cb);
extern size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb*);
extern void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb*, enum qemu_plugin_op, void*, uint64_t);
extern void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, atexit_cb, void*);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;
static uint64_t count;

static void trans(qemu_plugin_id_t id, struct qemu_plugin_tb* tb) {
  (void)id;
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &count, qemu_plugin_tb_n_insns(tb));
}
static void done(qemu_plugin_id_t id, void* p) {
  (void)id; (void)p;
  fprintf(stderr, "insns %" PRIu64 "\n", count);
}
__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t* info, int argc, char** argv) {
  (void)info; (void)argc; (void)argv;
  qemu_plugin_register_vcpu_tb_trans_cb(id, trans);
  qemu_plugin_register_atexit_cb(id, done, NULL);
  return 0;
}
