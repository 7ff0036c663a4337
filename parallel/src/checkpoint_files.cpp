// Checkpoint files: their names, crash-safe writes, checksums, and reading them back verified.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "backplane/parallel/distributed.h"
#include "checkpoint_files.h"
#include "checkpoint_manifest.h"

namespace backplane::parallel::checkpoint_files {
namespace fs = std::filesystem;

namespace {

// Every file of a checkpoint is followed by "<file>.crc32", its size and CRC-32, written by the same
// rank after the file and checked whenever the file is read: LibTorch's archive reader does not check
// the CRCs of its zip records, so a flipped byte inside a tensor would load without a word.
constexpr const char* kChecksumSuffix = ".crc32";

std::string two_digits(int value) {
  char text[16];
  std::snprintf(text, sizeof(text), "%02d", value);
  return text;
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// "<file>.tmp.<host>.<pid>": a writer's temporary name, which says whose it is.
fs::path temporary_of(const fs::path& file) {
  return file.string() + ".tmp." + host_name() + "." + std::to_string(::getpid());
}

std::string checksum_of(const std::string& bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  for (size_t done = 0; done < bytes.size();) {  // zlib takes the length as a uInt
    const auto piece = static_cast<uInt>(std::min<size_t>(bytes.size() - done, 1u << 30));
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), piece);
    done += piece;
  }
  char text[64];
  std::snprintf(text, sizeof(text), "size=%zu crc32=%08lx\n", bytes.size(), static_cast<unsigned long>(crc));
  return text;
}

std::string read_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(BPL_ERR_IO, "checkpoint file " + file.string() + " cannot be read: " + std::strerror(errno));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

std::string shard_name(int dp, int tp, int pp) {
  return "dp_rank_" + two_digits(dp) + "_tp_rank_" + two_digits(tp) + "_pp_rank_" + two_digits(pp) + ".pt";
}

// Writes `bytes` to `file` so that `file` is either absent, its old version, or complete: a temporary
// name, fsync, rename.
// Each failure names the file and the system's reason (a full disk: "No space left on device").
void write_bytes_atomically(const fs::path& file, const std::string& bytes) {
  const fs::path temporary = temporary_of(file);
  const auto failed = [&](const char* doing) {
    return Error(BPL_ERR_IO, std::string(doing) + " " + temporary.string() + " failed: " + std::strerror(errno));
  };
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw failed("creating");
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const Error error = failed("writing");
      ::close(fd);
      throw error;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const Error error = failed("syncing");
    ::close(fd);
    throw error;
  }
  if (::close(fd) != 0) throw failed("closing");  // a network file system may say only now
  std::error_code error;
  fs::rename(temporary, file, error);
  if (error) throw Error(BPL_ERR_IO, "renaming " + temporary.string() + " to " + file.string() + " failed: " + error.message());
}

// The file, then its checksum: a file without one is either being written or from before checksums.
void write_file_atomically(const fs::path& file, const std::string& bytes) {
  write_bytes_atomically(file, bytes);
  write_bytes_atomically(file.string() + kChecksumSuffix, checksum_of(bytes));
}

// Removes the temporaries that writers of this host left in `folder` (and its model/ and optim/)
// when they were killed: those whose process has ended. (Names without a host, from earlier
// versions, are taken as this host's.)
void remove_stale_temporaries(const fs::path& folder) {
  const std::string here = host_name();
  for (const fs::path& dir : {folder, folder / kModelDir, folder / kLoraDir, folder / "optim"}) {
    std::error_code error;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
      const std::string name = entry.path().filename().string();
      const size_t mark = name.rfind(".tmp.");
      if (mark == std::string::npos) continue;
      const std::string owner = name.substr(mark + 5);  // "<host>.<pid>" or "<pid>"
      const size_t dot = owner.rfind('.');
      const std::string host = dot == std::string::npos ? here : owner.substr(0, dot);
      const pid_t pid = static_cast<pid_t>(std::atoi(owner.substr(dot == std::string::npos ? 0 : dot + 1).c_str()));
      if (host != here || pid <= 0 || (::kill(pid, 0) == 0 || errno != ESRCH)) continue;
      fs::remove(entry.path(), error);
    }
  }
}

// Why `file` cannot be trusted ("" when it can): missing, or not what its checksum says. A file of an
// older checkpoint without a checksum is trusted, with a warning.
std::string integrity_problem(const fs::path& file, const std::string* bytes) {
  if (!fs::exists(file)) return "checkpoint file " + file.string() + " does not exist";
  const fs::path sum = file.string() + kChecksumSuffix;
  if (!fs::exists(sum)) {
    std::fprintf(stderr, "[backplane:parallel] WARN: checkpoint file %s has no checksum (written before checksums): "
                         "loaded unverified\n", file.c_str());
    return "";
  }
  std::string read;
  if (bytes == nullptr) bytes = &(read = read_bytes(file));
  std::string expected = read_bytes(sum);
  const std::string actual = checksum_of(*bytes);
  if (actual == expected) return "";
  expected.erase(expected.find_last_not_of('\n') + 1);
  return "checkpoint file " + file.string() + " is corrupt: it has " + actual.substr(0, actual.size() - 1) +
         ", its checksum file says " + expected;
}

std::pair<int, int> saved_layout(const fs::path& dir) {
  // The layout the checkpoint recorded, where it did; else what its files say.
  if (const std::optional<Manifest> manifest = read_manifest(dir.parent_path() / kDone)) {
    return {manifest->tensor_parallel_size, manifest->pipeline_parallel_size};
  }
  int tp = 0, pp = 0;
  while (fs::exists(dir / shard_name(0, tp, 0))) ++tp;
  while (fs::exists(dir / shard_name(0, 0, pp))) ++pp;
  return {tp, pp};
}

std::string serialize(torch::serialize::OutputArchive& archive) {
  std::ostringstream bytes;
  archive.save_to(bytes);
  return bytes.str();
}

torch::serialize::InputArchive read_archive(const fs::path& file) {
  if (!fs::exists(file)) throw Error(BPL_ERR_NOT_FOUND, "checkpoint file " + file.string() + " does not exist");
  const std::string bytes = read_bytes(file);
  const std::string problem = integrity_problem(file, &bytes);
  if (!problem.empty()) throw Error(BPL_ERR_IO, problem);
  torch::serialize::InputArchive archive;
  try {
    std::istringstream in(bytes);
    archive.load_from(in);
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw Error(BPL_ERR_IO, "checkpoint file " + file.string() + " is corrupt or truncated: " +
                                what.substr(0, what.find('\n')));
  }
  return archive;
}

}  // namespace backplane::parallel::checkpoint_files
