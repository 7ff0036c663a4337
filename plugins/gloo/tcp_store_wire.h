// The bytes of backplane's TCP store (tcp_store.h), shared by its server and its client: the greeting,
// the operations, and frames of fixed-width little-endian fields.
//
//   greeting   client and server each send kGreeting (the server only after reading the client's)
//   frame      u32 length, then that many bytes
//   request    u8 operation, then:   set: key, the value's bytes to the frame's end
//                                    get: i64 timeout_ms, key   add: key, i64 delta   check: key
//                                    set when closed: key, the value's bytes to the frame's end
//              (a key: u32 length, then the bytes)
//   answer     set: u8 0, or u8 2 (refused: the store holds its bound)
//              get: u8 0 and the value's bytes, or u8 1 (timed out)   add: i64 sum, or nothing (refused)
//              check: u8 0 or 1   set when closed: u8 0 (the key is set once this connection ends)
//              erase prefix: key (the prefix)   answer: i64, how many keys it erased
//              admit: the job's secret (a key; empty: none)   answer: u8 0, or u8 2 (refused: the
//              connection then ends). Every client sends it first; a store with a secret serves
//              nothing before it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace backplane::gloo_plugin::wire {

constexpr char kGreeting[] = "backplane-store 1\n";
constexpr size_t kGreetingSize = sizeof(kGreeting) - 1;
// How torch's TCPStore client opens a connection: its VALIDATE query (0) and validation number
// 0x3C85F7CE, little-endian. A server that serves both stores tells the two clients apart by it.
constexpr uint8_t kTorchStoreGreeting[] = {0x00, 0xCE, 0xF7, 0x85, 0x3C};
// No frame of the rendezvous comes near this: a client refuses a larger value, and a server that reads a
// larger length takes its peer for something that does not speak this protocol.
constexpr uint32_t kMaxFrame = 64u << 20;

enum Operation : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kSetWhenClosed = 5, kErasePrefix = 6, kAdmit = 7 };
enum GetAnswer : uint8_t { kFound = 0, kTimedOut = 1 };
enum SetAnswer : uint8_t { kStored = 0, kRefused = 2 };

inline void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline void put_i64(std::vector<uint8_t>& out, int64_t value) {
  const uint64_t v = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline void put_bytes(std::vector<uint8_t>& out, const void* data, size_t size) {
  put_u32(out, static_cast<uint32_t>(size));
  const auto* bytes = static_cast<const uint8_t*>(data);
  out.insert(out.end(), bytes, bytes + size);
}
inline void put_string(std::vector<uint8_t>& out, const std::string& text) { put_bytes(out, text.data(), text.size()); }

inline uint32_t read_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

// Reads the fields of one frame in order; any read past its end makes it bad.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool good() const { return good_; }
  bool at_end() const { return offset_ == size_; }
  uint8_t u8() { return take(1) ? data_[offset_ - 1] : 0; }
  int64_t i64() {
    if (!take(8)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(data_[offset_ - 8 + i]) << (8 * i);
    return static_cast<int64_t>(v);
  }
  std::string string() {
    if (!take(4)) return {};
    const uint32_t length = read_u32(data_ + offset_ - 4);
    if (!take(length)) return {};
    return std::string(reinterpret_cast<const char*>(data_ + offset_ - length), length);
  }
  std::vector<uint8_t> rest() {
    std::vector<uint8_t> bytes(data_ + offset_, data_ + size_);
    offset_ = size_;
    return bytes;
  }

 private:
  bool take(size_t n) {
    if (!good_ || size_ - offset_ < n) return good_ = false;
    offset_ += n;
    return true;
  }
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
  bool good_ = true;
};

// A frame: its length first.
inline std::vector<uint8_t> framed(const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out;
  out.reserve(payload.size() + 4);
  put_u32(out, static_cast<uint32_t>(payload.size()));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

}  // namespace backplane::gloo_plugin::wire
