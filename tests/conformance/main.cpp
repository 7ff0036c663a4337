// The plugin conformance suite: every collective × dtype × reduce op × size, in place and async,
// point to point and comm_split, checked against values computed locally. It runs unchanged against
// any backend, as real processes under a launcher:
//
//   bpl-run --nproc-per-node 3 bpl-conformance --backend=gloo
//   mpirun -np 3 bpl-conformance --backend=mpi
//
// Every rank runs every test in the same order; a test never returns between collectives, so one
// rank's failed check cannot desynchronise the others. Without --backend the environment selects.

#include "conformance/conformance.h"

namespace backplane::test {
namespace {

/* ---- the list of kinds ---- */

// Whether a test's "Suite.Name" has the words of a kind's name in order ("recv_any": Recv...Any),
// ignoring case.
bool names_kind(std::string test, const std::string& kind) {
  std::transform(test.begin(), test.end(), test.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  size_t at = 0;
  for (size_t start = 0; start <= kind.size();) {
    const size_t end = std::min(kind.find('_', start), kind.size());
    at = test.find(kind.substr(start, end - start), at);
    if (at == std::string::npos) return false;
    start = end + 1;
  }
  return true;
}

// Every kind of the ABI's list (BPL_FOR_EACH_COLLECTIVE) has a test here that names it: a kind added to
// the list without one fails here, by name.
TEST(Conformance, EveryKindOfTheAbiHasATest) {
  std::vector<std::string> tests;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      tests.push_back(std::string(suite.name()) + "." + suite.GetTestInfo(t)->name());
    }
  }
#define BPL_EXPECT_TESTED(code, name, minor)                                                            \
  EXPECT_TRUE(std::any_of(tests.begin(), tests.end(), [](const std::string& test) { return names_kind(test, name); })) \
      << "no conformance test names " << name;
  BPL_FOR_EACH_COLLECTIVE(BPL_EXPECT_TESTED)
#undef BPL_EXPECT_TESTED
  EXPECT_FALSE(names_kind("Movement.Allgather", "recv_any"));  // the matcher itself can say no
}

}  // namespace
}  // namespace backplane::test

int main(int argc, char** argv) {
  using backplane::test::world;
  ::testing::InitGoogleTest(&argc, argv);
  std::string backend;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--backend=", 10) == 0) {
      backend = argv[i] + 10;
    } else {
      std::fprintf(stderr, "usage: bpl-conformance [gtest flags] [--backend=NAME|PATH]\n");
      return 2;
    }
  }
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.backend = backend.empty() ? nullptr : backend.c_str();
  bpl_status status = bpl_init(&options, &world.runtime);
  if (status != BPL_OK) {
    std::fprintf(stderr, "bpl-conformance: bpl_init failed: %s: %s\n", bpl_status_name(status), bpl_last_error());
    return 1;
  }
  bpl_runtime_describe(world.runtime, &world.info);
  bpl_comm_world(world.runtime, &world.comm);
  world.rank = world.info.rank;
  world.size = world.info.world_size;
  if (world.rank == 0) {
    std::printf("conformance: backend %s (%s) from %s, %d rank(s)\n", world.info.backend, world.info.details,
                world.info.plugin_path, world.size);
  }
  backplane::test::report_failures_only_unless_rank_zero(world.rank);
  int result = RUN_ALL_TESTS();
  status = bpl_finalize(world.runtime);
  if (status != BPL_OK) {
    std::fprintf(stderr, "rank %d: bpl_finalize failed: %s\n", world.rank, bpl_last_error());
    result = 1;
  }
  return result;
}
