// Pins the layout of every public struct of ABI 1.x (x86-64 / LP64): a change here breaks every plugin
// and embedder built before it. Structs may only grow at the end (ABI rule 3), and none ends in padding,
// so an older caller's struct_size never covers bytes a newer field would read as garbage.
#include <gtest/gtest.h>

#include <cstddef>

#include "backplane/plugin.h"

#define EXPECT_NO_TRAILING_PADDING(T, last) EXPECT_EQ(sizeof(T), offsetof(T, last) + sizeof(T::last))

TEST(AbiLayout, bpl_init_options) {
  EXPECT_EQ(offsetof(bpl_init_options, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_init_options), 72u);
  EXPECT_EQ(offsetof(bpl_init_options, backend), 8u);
  EXPECT_EQ(offsetof(bpl_init_options, rank), 16u);
  EXPECT_EQ(offsetof(bpl_init_options, world_size), 20u);
  EXPECT_EQ(offsetof(bpl_init_options, local_rank), 24u);
  EXPECT_EQ(offsetof(bpl_init_options, local_world_size), 28u);
  EXPECT_EQ(offsetof(bpl_init_options, master_addr), 32u);
  EXPECT_EQ(offsetof(bpl_init_options, master_port), 40u);
  EXPECT_EQ(offsetof(bpl_init_options, timeout_ms), 48u);
  // ABI 1.2
  EXPECT_EQ(offsetof(bpl_init_options, store), 56u);
  // ABI 1.4
  EXPECT_EQ(offsetof(bpl_init_options, native_comm), 64u);
  EXPECT_NO_TRAILING_PADDING(bpl_init_options, native_comm);
}

TEST(AbiLayout, bpl_store) {  // ABI 1.2
  EXPECT_EQ(offsetof(bpl_store, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_store), 56u);
  EXPECT_EQ(offsetof(bpl_store, context), 8u);
  EXPECT_EQ(offsetof(bpl_store, set), 16u);
  EXPECT_EQ(offsetof(bpl_store, get), 24u);
  EXPECT_EQ(offsetof(bpl_store, add), 32u);
  EXPECT_EQ(offsetof(bpl_store, check), 40u);
  EXPECT_EQ(offsetof(bpl_store, last_error), 48u);
  EXPECT_NO_TRAILING_PADDING(bpl_store, last_error);
}

TEST(AbiLayout, bpl_runtime_info) {
  EXPECT_EQ(offsetof(bpl_runtime_info, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_runtime_info), 120u);
  EXPECT_EQ(offsetof(bpl_runtime_info, backend), 8u);
  EXPECT_EQ(offsetof(bpl_runtime_info, plugin_path), 16u);
  EXPECT_EQ(offsetof(bpl_runtime_info, plugin_version), 24u);
  EXPECT_EQ(offsetof(bpl_runtime_info, selection_reason), 32u);
  EXPECT_EQ(offsetof(bpl_runtime_info, launcher), 40u);
  EXPECT_EQ(offsetof(bpl_runtime_info, details), 48u);
  EXPECT_EQ(offsetof(bpl_runtime_info, plugin_abi_major), 56u);
  EXPECT_EQ(offsetof(bpl_runtime_info, plugin_abi_minor), 60u);
  EXPECT_EQ(offsetof(bpl_runtime_info, rank), 64u);
  EXPECT_EQ(offsetof(bpl_runtime_info, world_size), 68u);
  EXPECT_EQ(offsetof(bpl_runtime_info, local_rank), 72u);
  EXPECT_EQ(offsetof(bpl_runtime_info, local_world_size), 76u);
  EXPECT_EQ(offsetof(bpl_runtime_info, device_count), 80u);
  EXPECT_EQ(offsetof(bpl_runtime_info, dtypes), 84u);
  EXPECT_EQ(offsetof(bpl_runtime_info, collectives), 88u);
  EXPECT_EQ(offsetof(bpl_runtime_info, reduce_ops), 96u);
  EXPECT_EQ(offsetof(bpl_runtime_info, kernels), 100u);
  EXPECT_EQ(offsetof(bpl_runtime_info, timeout_ms), 104u);
  EXPECT_EQ(offsetof(bpl_runtime_info, program_formats), 112u);
  EXPECT_NO_TRAILING_PADDING(bpl_runtime_info, program_formats);
}

TEST(AbiLayout, bpl_selection) {
  EXPECT_EQ(offsetof(bpl_selection, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_selection), 8776u);
  EXPECT_EQ(offsetof(bpl_selection, backend), 8u);
  EXPECT_EQ(offsetof(bpl_selection, reason), 72u);
  EXPECT_EQ(offsetof(bpl_selection, plugin_path), 584u);
  // ABI 1.5
  EXPECT_EQ(offsetof(bpl_selection, plugin_folders), 4680u);
  EXPECT_NO_TRAILING_PADDING(bpl_selection, plugin_folders);
}

TEST(AbiLayout, bpl_plugin_info) {
  EXPECT_EQ(offsetof(bpl_plugin_info, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_plugin_info), 4240u);
  EXPECT_EQ(offsetof(bpl_plugin_info, name), 8u);
  EXPECT_EQ(offsetof(bpl_plugin_info, version), 72u);
  EXPECT_EQ(offsetof(bpl_plugin_info, path), 136u);
  EXPECT_EQ(offsetof(bpl_plugin_info, abi_major), 4232u);
  EXPECT_EQ(offsetof(bpl_plugin_info, abi_minor), 4236u);
  EXPECT_NO_TRAILING_PADDING(bpl_plugin_info, abi_minor);
}

TEST(AbiLayout, bpl_device_properties) {
  EXPECT_EQ(offsetof(bpl_device_properties, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_device_properties), 96u);
  EXPECT_EQ(offsetof(bpl_device_properties, name), 8u);
  EXPECT_EQ(offsetof(bpl_device_properties, kind), 72u);
  EXPECT_EQ(offsetof(bpl_device_properties, index), 76u);
  EXPECT_EQ(offsetof(bpl_device_properties, total_memory), 80u);
  EXPECT_EQ(offsetof(bpl_device_properties, free_memory), 88u);
  EXPECT_NO_TRAILING_PADDING(bpl_device_properties, free_memory);
}

TEST(AbiLayout, bpl_gemm_args) {
  EXPECT_EQ(offsetof(bpl_gemm_args, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_gemm_args), 112u);
  EXPECT_EQ(offsetof(bpl_gemm_args, device), 8u);
  EXPECT_EQ(offsetof(bpl_gemm_args, dtype), 12u);
  EXPECT_EQ(offsetof(bpl_gemm_args, trans_a), 16u);
  EXPECT_EQ(offsetof(bpl_gemm_args, trans_b), 20u);
  EXPECT_EQ(offsetof(bpl_gemm_args, m), 24u);
  EXPECT_EQ(offsetof(bpl_gemm_args, n), 32u);
  EXPECT_EQ(offsetof(bpl_gemm_args, k), 40u);
  EXPECT_EQ(offsetof(bpl_gemm_args, alpha), 48u);
  EXPECT_EQ(offsetof(bpl_gemm_args, beta), 56u);
  EXPECT_EQ(offsetof(bpl_gemm_args, a), 64u);
  EXPECT_EQ(offsetof(bpl_gemm_args, lda), 72u);
  EXPECT_EQ(offsetof(bpl_gemm_args, b), 80u);
  EXPECT_EQ(offsetof(bpl_gemm_args, ldb), 88u);
  EXPECT_EQ(offsetof(bpl_gemm_args, c), 96u);
  EXPECT_EQ(offsetof(bpl_gemm_args, ldc), 104u);
  EXPECT_NO_TRAILING_PADDING(bpl_gemm_args, ldc);
}

TEST(AbiLayout, bpl_elementwise_args) {
  EXPECT_EQ(offsetof(bpl_elementwise_args, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_elementwise_args), 64u);
  EXPECT_EQ(offsetof(bpl_elementwise_args, device), 8u);
  EXPECT_EQ(offsetof(bpl_elementwise_args, dtype), 12u);
  EXPECT_EQ(offsetof(bpl_elementwise_args, count), 16u);
  EXPECT_EQ(offsetof(bpl_elementwise_args, alpha), 24u);
  EXPECT_EQ(offsetof(bpl_elementwise_args, beta), 32u);
  EXPECT_EQ(offsetof(bpl_elementwise_args, x), 40u);
  EXPECT_EQ(offsetof(bpl_elementwise_args, y), 48u);
  EXPECT_EQ(offsetof(bpl_elementwise_args, out), 56u);
  EXPECT_NO_TRAILING_PADDING(bpl_elementwise_args, out);
}

TEST(AbiLayout, bpl_cast_args) {
  EXPECT_EQ(offsetof(bpl_cast_args, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_cast_args), 48u);
  EXPECT_EQ(offsetof(bpl_cast_args, device), 8u);
  EXPECT_EQ(offsetof(bpl_cast_args, from), 12u);
  EXPECT_EQ(offsetof(bpl_cast_args, to), 16u);
  EXPECT_EQ(offsetof(bpl_cast_args, reserved0), 20u);
  EXPECT_EQ(offsetof(bpl_cast_args, count), 24u);
  EXPECT_EQ(offsetof(bpl_cast_args, src), 32u);
  EXPECT_EQ(offsetof(bpl_cast_args, dst), 40u);
  EXPECT_NO_TRAILING_PADDING(bpl_cast_args, dst);
}

TEST(AbiLayout, bpl_program_options) {
  EXPECT_EQ(offsetof(bpl_program_options, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_program_options), 40u);
  EXPECT_EQ(offsetof(bpl_program_options, format), 8u);
  EXPECT_EQ(offsetof(bpl_program_options, flags), 16u);
  EXPECT_EQ(offsetof(bpl_program_options, entry), 24u);
  EXPECT_EQ(offsetof(bpl_program_options, device), 32u);
  EXPECT_EQ(offsetof(bpl_program_options, reserved0), 36u);
  EXPECT_NO_TRAILING_PADDING(bpl_program_options, reserved0);
}

TEST(AbiLayout, bpl_tensor) {
  EXPECT_EQ(offsetof(bpl_tensor, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_tensor), 88u);
  EXPECT_EQ(offsetof(bpl_tensor, data), 8u);
  EXPECT_EQ(offsetof(bpl_tensor, dtype), 16u);
  EXPECT_EQ(offsetof(bpl_tensor, ndim), 20u);
  EXPECT_EQ(offsetof(bpl_tensor, shape), 24u);
  EXPECT_NO_TRAILING_PADDING(bpl_tensor, shape);
}

TEST(AbiLayout, bpl_launch_info) {
  EXPECT_EQ(offsetof(bpl_launch_info, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_launch_info), 72u);
  EXPECT_EQ(offsetof(bpl_launch_info, rank), 8u);
  EXPECT_EQ(offsetof(bpl_launch_info, world_size), 12u);
  EXPECT_EQ(offsetof(bpl_launch_info, local_rank), 16u);
  EXPECT_EQ(offsetof(bpl_launch_info, local_world_size), 20u);
  EXPECT_EQ(offsetof(bpl_launch_info, master_addr), 24u);
  EXPECT_EQ(offsetof(bpl_launch_info, launcher), 32u);
  EXPECT_EQ(offsetof(bpl_launch_info, master_port), 40u);
  EXPECT_EQ(offsetof(bpl_launch_info, reserved0), 44u);
  EXPECT_EQ(offsetof(bpl_launch_info, timeout_ms), 48u);
  // ABI 1.2
  EXPECT_EQ(offsetof(bpl_launch_info, store), 56u);
  // ABI 1.4
  EXPECT_EQ(offsetof(bpl_launch_info, native_comm), 64u);
  EXPECT_NO_TRAILING_PADDING(bpl_launch_info, native_comm);
}

TEST(AbiLayout, bpl_host_api) {
  EXPECT_EQ(offsetof(bpl_host_api, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_host_api), 56u);
  EXPECT_EQ(offsetof(bpl_host_api, abi_major), 8u);
  EXPECT_EQ(offsetof(bpl_host_api, abi_minor), 12u);
  EXPECT_EQ(offsetof(bpl_host_api, log_level), 16u);
  EXPECT_EQ(offsetof(bpl_host_api, reserved0), 20u);
  EXPECT_EQ(offsetof(bpl_host_api, log), 24u);
  EXPECT_EQ(offsetof(bpl_host_api, get_env), 32u);
  EXPECT_EQ(offsetof(bpl_host_api, set_error), 40u);
  // ABI 1.10
  EXPECT_EQ(offsetof(bpl_host_api, current_operation), 48u);
  EXPECT_NO_TRAILING_PADDING(bpl_host_api, current_operation);
}

TEST(AbiLayout, bpl_operation_identity) {
  EXPECT_EQ(sizeof(bpl_operation_identity), 56u);
  EXPECT_EQ(offsetof(bpl_operation_identity, struct_size), 0u);
  EXPECT_EQ(offsetof(bpl_operation_identity, sequence), 8u);
  EXPECT_EQ(offsetof(bpl_operation_identity, hash), 16u);
  EXPECT_EQ(offsetof(bpl_operation_identity, kind), 24u);
  EXPECT_EQ(offsetof(bpl_operation_identity, dtype), 28u);
  EXPECT_EQ(offsetof(bpl_operation_identity, count), 32u);
  EXPECT_EQ(offsetof(bpl_operation_identity, root), 40u);
  EXPECT_EQ(offsetof(bpl_operation_identity, reduce_op), 44u);
  EXPECT_EQ(offsetof(bpl_operation_identity, pairing), 48u);
  EXPECT_NO_TRAILING_PADDING(bpl_operation_identity, pairing);
  EXPECT_EQ(BPL_OPERATION_FINALIZE, 1000);
  EXPECT_EQ(BPL_OPERATION_FINGERPRINT_CHECK, 1001);
}

TEST(AbiLayout, bpl_plugin_caps) {
  EXPECT_EQ(offsetof(bpl_plugin_caps, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_plugin_caps), 48u);
  EXPECT_EQ(offsetof(bpl_plugin_caps, collectives), 8u);
  EXPECT_EQ(offsetof(bpl_plugin_caps, dtypes), 16u);
  EXPECT_EQ(offsetof(bpl_plugin_caps, reduce_ops), 20u);
  EXPECT_EQ(offsetof(bpl_plugin_caps, details), 24u);
  EXPECT_EQ(offsetof(bpl_plugin_caps, kernels), 32u);
  EXPECT_EQ(offsetof(bpl_plugin_caps, reserved0), 36u);
  EXPECT_EQ(offsetof(bpl_plugin_caps, program_formats), 40u);
  EXPECT_NO_TRAILING_PADDING(bpl_plugin_caps, program_formats);
}

TEST(AbiLayout, bpl_plugin_api) {
  EXPECT_EQ(offsetof(bpl_plugin_api, struct_size), 0u);
  EXPECT_EQ(sizeof(bpl_plugin_api), 416u);
  EXPECT_EQ(offsetof(bpl_plugin_api, abi_major), 8u);
  EXPECT_EQ(offsetof(bpl_plugin_api, abi_minor), 12u);
  EXPECT_EQ(offsetof(bpl_plugin_api, name), 16u);
  EXPECT_EQ(offsetof(bpl_plugin_api, version), 24u);
  EXPECT_EQ(offsetof(bpl_plugin_api, runtime_create), 32u);
  EXPECT_EQ(offsetof(bpl_plugin_api, runtime_destroy), 40u);
  EXPECT_EQ(offsetof(bpl_plugin_api, runtime_describe), 48u);
  EXPECT_EQ(offsetof(bpl_plugin_api, device_count), 56u);
  EXPECT_EQ(offsetof(bpl_plugin_api, device_properties), 64u);
  EXPECT_EQ(offsetof(bpl_plugin_api, mem_alloc), 72u);
  EXPECT_EQ(offsetof(bpl_plugin_api, mem_free), 80u);
  EXPECT_EQ(offsetof(bpl_plugin_api, mem_copy), 88u);
  EXPECT_EQ(offsetof(bpl_plugin_api, synchronize), 96u);
  EXPECT_EQ(offsetof(bpl_plugin_api, comm_world), 104u);
  EXPECT_EQ(offsetof(bpl_plugin_api, comm_split), 112u);
  EXPECT_EQ(offsetof(bpl_plugin_api, comm_destroy), 120u);
  EXPECT_EQ(offsetof(bpl_plugin_api, comm_rank_size), 128u);
  EXPECT_EQ(offsetof(bpl_plugin_api, allreduce), 136u);
  EXPECT_EQ(offsetof(bpl_plugin_api, broadcast), 144u);
  EXPECT_EQ(offsetof(bpl_plugin_api, reduce), 152u);
  EXPECT_EQ(offsetof(bpl_plugin_api, allgather), 160u);
  EXPECT_EQ(offsetof(bpl_plugin_api, reduce_scatter), 168u);
  EXPECT_EQ(offsetof(bpl_plugin_api, alltoall), 176u);
  EXPECT_EQ(offsetof(bpl_plugin_api, barrier), 184u);
  EXPECT_EQ(offsetof(bpl_plugin_api, send), 192u);
  EXPECT_EQ(offsetof(bpl_plugin_api, recv), 200u);
  EXPECT_EQ(offsetof(bpl_plugin_api, request_test), 208u);
  EXPECT_EQ(offsetof(bpl_plugin_api, request_wait), 216u);
  EXPECT_EQ(offsetof(bpl_plugin_api, request_free), 224u);
  EXPECT_EQ(offsetof(bpl_plugin_api, gemm), 232u);
  EXPECT_EQ(offsetof(bpl_plugin_api, elementwise), 240u);
  EXPECT_EQ(offsetof(bpl_plugin_api, cast), 248u);
  EXPECT_EQ(offsetof(bpl_plugin_api, program_compiler), 256u);
  EXPECT_EQ(offsetof(bpl_plugin_api, program_compile), 264u);
  EXPECT_EQ(offsetof(bpl_plugin_api, artifact_free), 272u);
  EXPECT_EQ(offsetof(bpl_plugin_api, program_load), 280u);
  EXPECT_EQ(offsetof(bpl_plugin_api, program_run), 288u);
  EXPECT_EQ(offsetof(bpl_plugin_api, program_destroy), 296u);
  // ABI 1.1
  EXPECT_EQ(offsetof(bpl_plugin_api, comm_set_timeout), 304u);
  EXPECT_EQ(offsetof(bpl_plugin_api, comm_abort), 312u);
  // ABI 1.2
  EXPECT_EQ(offsetof(bpl_plugin_api, comm_create_from_store), 320u);
  // ABI 1.3
  EXPECT_EQ(offsetof(bpl_plugin_api, gather), 328u);
  EXPECT_EQ(offsetof(bpl_plugin_api, scatter), 336u);
  EXPECT_EQ(offsetof(bpl_plugin_api, allgatherv), 344u);
  EXPECT_EQ(offsetof(bpl_plugin_api, alltoallv), 352u);
  EXPECT_EQ(offsetof(bpl_plugin_api, comm_path), 360u);
  EXPECT_EQ(offsetof(bpl_plugin_api, recv_any), 368u);  // 1.6
  // ABI 1.8
  EXPECT_EQ(offsetof(bpl_plugin_api, comm_revoke), 376u);
  EXPECT_EQ(offsetof(bpl_plugin_api, comm_agree), 384u);
  EXPECT_EQ(offsetof(bpl_plugin_api, comm_shrink), 392u);
  EXPECT_EQ(offsetof(bpl_plugin_api, comm_grow), 400u);
  EXPECT_EQ(offsetof(bpl_plugin_api, comm_join), 408u);
  EXPECT_NO_TRAILING_PADDING(bpl_plugin_api, comm_join);
}

TEST(AbiLayout, FixedNumericValues) {
  EXPECT_EQ(BPL_ABI_MAJOR, 1);
  EXPECT_EQ(BPL_OK, 0);
  const bpl_status statuses[] = {BPL_ERR_INVALID_ARGUMENT, BPL_ERR_NOT_FOUND,   BPL_ERR_UNSUPPORTED, BPL_ERR_UNAVAILABLE,
                                 BPL_ERR_ABI_MISMATCH,     BPL_ERR_TIMEOUT,     BPL_ERR_REMOTE,      BPL_ERR_MISMATCH,
                                 BPL_ERR_OUT_OF_MEMORY,    BPL_ERR_IO,          BPL_ERR_INTERNAL,    BPL_ERR_ABORTED,
                                 BPL_ERR_REVOKED};
  for (int i = 0; i < 13; ++i) EXPECT_EQ(statuses[i], i + 1);
  const bpl_dtype dtypes[] = {BPL_DTYPE_F32, BPL_DTYPE_F64, BPL_DTYPE_F16, BPL_DTYPE_BF16,
                              BPL_DTYPE_I8,  BPL_DTYPE_U8,  BPL_DTYPE_I32, BPL_DTYPE_I64};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(dtypes[i], i + 1);
  const bpl_reduce_op ops[] = {BPL_OP_SUM, BPL_OP_PROD, BPL_OP_MIN, BPL_OP_MAX, BPL_OP_AVG, BPL_OP_BAND, BPL_OP_BOR, BPL_OP_BXOR};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(ops[i], i + 1);
  EXPECT_EQ(BPL_COLL_ALLREDUCE, 1);
  EXPECT_EQ(BPL_COLL_COMM_SPLIT, 10);
  EXPECT_EQ(BPL_COLL_GATHER, 11);
  EXPECT_EQ(BPL_COLL_ALLTOALLV, 14);
  EXPECT_EQ(BPL_COLL_RECV_ANY, 15);
  EXPECT_EQ(BPL_COLOR_UNDEFINED, -1);
  EXPECT_EQ(BPL_TIMEOUT_DEFAULT, -1);
}

TEST(AbiLayout, InitializersSetSizeAndDefaults) {
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  EXPECT_EQ(options.struct_size, sizeof(bpl_init_options));
  EXPECT_EQ(options.backend, nullptr);
  EXPECT_EQ(options.rank, -1);
  EXPECT_EQ(options.world_size, -1);
  EXPECT_EQ(options.master_port, -1);
  EXPECT_EQ(options.timeout_ms, -1);
  EXPECT_EQ(options.store, nullptr);
  bpl_store store = BPL_STORE_INIT;
  EXPECT_EQ(store.struct_size, sizeof(bpl_store));
  EXPECT_EQ(store.set, nullptr);
  EXPECT_EQ(store.last_error, nullptr);
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  EXPECT_EQ(info.struct_size, sizeof(bpl_runtime_info));
  bpl_selection selection = BPL_SELECTION_INIT;
  EXPECT_EQ(selection.struct_size, sizeof(bpl_selection));
  bpl_plugin_info plugin = BPL_PLUGIN_INFO_INIT;
  EXPECT_EQ(plugin.struct_size, sizeof(bpl_plugin_info));
  bpl_device_properties props = BPL_DEVICE_PROPERTIES_INIT;
  EXPECT_EQ(props.struct_size, sizeof(bpl_device_properties));
}

TEST(AbiLayout, NamesOfEnumerations) {
  EXPECT_STREQ(bpl_status_name(BPL_ERR_TIMEOUT), "BPL_ERR_TIMEOUT");
  EXPECT_STREQ(bpl_status_name(999), "BPL_ERR_UNKNOWN");
  EXPECT_STREQ(bpl_dtype_name(BPL_DTYPE_BF16), "bf16");
  EXPECT_EQ(bpl_dtype_size(BPL_DTYPE_BF16), 2u);
  EXPECT_EQ(bpl_dtype_size(BPL_DTYPE_I64), 8u);
  EXPECT_EQ(bpl_dtype_size(0), 0u);
  EXPECT_STREQ(bpl_reduce_op_name(BPL_OP_AVG), "avg");
  EXPECT_STREQ(bpl_reduce_op_name(BPL_OP_BXOR), "bxor");
  EXPECT_STREQ(bpl_reduce_op_name(BPL_OP_BXOR + 1), "unknown");
  EXPECT_STREQ(bpl_collective_name(BPL_COLL_REDUCE_SCATTER), "reduce_scatter");
  int32_t major = 0, minor = -1;
  bpl_abi_version(&major, &minor);
  EXPECT_EQ(major, BPL_ABI_MAJOR);
  EXPECT_EQ(minor, BPL_ABI_MINOR);
}
