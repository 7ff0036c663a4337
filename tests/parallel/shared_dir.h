// A temporary folder that every rank of the world sees, for the checkpoint tests.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

#include "backplane/parallel.h"

namespace backplane::test {

// A fresh folder: made by rank 0, its name broadcast.
inline std::string shared_temp_dir() {
  std::string made;
  if (parallel::get_rank() == 0) {
    char pattern[] = "/tmp/bpl-checkpoint-test-XXXXXX";
    if (mkdtemp(pattern) != nullptr) made = pattern;
  }
  const std::string dir = parallel::get_world_group()->broadcast_bytes(made, 0);
  if (dir.empty()) throw std::runtime_error("rank 0 could not make a folder under /tmp");
  return dir;
}

// Removes it once every rank is done with it.
inline void remove_shared_temp_dir(const std::string& dir) {
  parallel::get_world_group()->barrier();
  if (parallel::get_rank() == 0) std::filesystem::remove_all(dir);
}

// A test with a fresh shared folder, `dir`; the model-parallel state is destroyed after it.
class SharedDirTest : public ::testing::Test {
 protected:
  void SetUp() override { dir = shared_temp_dir(); }
  void TearDown() override {
    remove_shared_temp_dir(dir);
    parallel::destroy_model_parallel();
  }
  std::string dir;
};

}  // namespace backplane::test
