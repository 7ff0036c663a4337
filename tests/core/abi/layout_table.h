/* One entry of a layout table (layout_table.c): a name ("sizeof(bpl_tensor)", "offsetof(bpl_tensor, data)",
 * "BPL_ERR_TIMEOUT") and its value. Tables end with a NULL name. */
#ifndef BPL_TEST_LAYOUT_TABLE_H
#define BPL_TEST_LAYOUT_TABLE_H
struct bpl_layout_entry {
  const char* name;
  long long value;
};
#ifdef __cplusplus
extern "C" {
#endif
extern const struct bpl_layout_entry bpl_layout_1_0[];
extern const struct bpl_layout_entry bpl_layout_current[];
#ifdef __cplusplus
}
#endif
#endif
