// Checkpoint files written crash-safe (parallel/src/checkpoint_files.h): a write that fails says which
// file and why, the system's own reason kept ("No space left on device" for a full disk: /dev/full).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "checkpoint_files.h"

namespace {

namespace fs = std::filesystem;

TEST(CheckpointFilesTest, AWriteToAFullDiskSaysSoNamingTheFile) {
  char folder_template[] = "/tmp/bpl-checkpoint-files-XXXXXX";
  const fs::path folder = ::mkdtemp(folder_template);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  // The writer's temporary name is "<file>.tmp.<host>.<pid>": there, a full disk.
  const fs::path file = folder / "shard.pt";
  const fs::path temporary = file.string() + ".tmp." + host + "." + std::to_string(::getpid());
  fs::create_symlink("/dev/full", temporary);
  std::string message;
  try {
    backplane::parallel::checkpoint_files::write_bytes_atomically(file, std::string(4096, 'x'));
  } catch (const std::exception& e) {
    message = e.what();
  }
  fs::remove_all(folder);
  EXPECT_NE(message.find("writing " + temporary.string() + " failed: No space left on device"), std::string::npos)
      << message;
  EXPECT_FALSE(fs::exists(file));
}

}  // namespace
