#include "fingerprint.h"

#include <algorithm>
#include <sstream>

namespace backplane {
namespace {

// Marks the words as a fingerprint of this encoding ("bplfp" and a version).
constexpr int64_t kFingerprintMagic = 0x62706c6670000001ll;

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? "," : "") + std::to_string(ranks[i]);
  return text;
}

// splitmix64's finalizer: every bit of the input moves about half of the output's.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t pairing_term(int sender, int receiver, uint64_t count) {
  return mix(mix((static_cast<uint64_t>(static_cast<uint32_t>(sender)) << 32) | static_cast<uint32_t>(receiver)) ^ count);
}

FingerprintWords encode(const Fingerprint& f) {
  return {kFingerprintMagic, f.sequence, f.op, f.dtype, f.count, f.root, f.reduce_op, f.pairing};
}

uint64_t call_hash(const Fingerprint& f) {
  // Every call is hashed (the core hands each its hash): each field times an odd constant of its own,
  // summed, then mixed once. Times an odd constant is one-to-one, so calls that differ in one field
  // never collide; the six products do not wait for each other as a chain of mixes would.
  const uint64_t sum = static_cast<uint64_t>(f.sequence) * 0xd6e8feb86659fd93ull +
                       static_cast<uint64_t>(f.op) * 0xa0761d6478bd642full +
                       static_cast<uint64_t>(f.dtype) * 0xe7037ed1a0b428dbull +
                       static_cast<uint64_t>(f.count) * 0x8ebc6af09c88c6e3ull +
                       static_cast<uint64_t>(f.root) * 0x589965cc75374cc3ull +
                       static_cast<uint64_t>(f.reduce_op) * 0x1d8e4e27c47d124full;
  return mix(sum ^ static_cast<uint64_t>(kFingerprintMagic));  // not the pairing: each rank's own
}

bpl_operation_identity identity_of(const Fingerprint& f) {
  bpl_operation_identity identity{};
  identity.struct_size = sizeof(identity);
  identity.sequence = static_cast<uint64_t>(f.sequence);
  identity.hash = call_hash(f);
  identity.kind = static_cast<int32_t>(f.op);
  identity.dtype = static_cast<int32_t>(f.dtype);
  identity.count = f.count;
  identity.root = static_cast<int32_t>(f.root);
  identity.reduce_op = static_cast<int32_t>(f.reduce_op);
  identity.pairing = f.pairing;
  return identity;
}

Fingerprint fingerprint_of(const bpl_operation_identity& identity) {
  Fingerprint f;
  f.sequence = static_cast<int64_t>(identity.sequence);
  f.op = identity.kind;
  f.dtype = identity.dtype;
  f.count = identity.count;
  f.root = identity.root;
  f.reduce_op = identity.reduce_op;
  f.pairing = identity.pairing;
  return f;
}

std::optional<Fingerprint> decode(const FingerprintWords& words) {
  if (words[0] != kFingerprintMagic) return std::nullopt;
  Fingerprint f;
  f.sequence = words[1];
  f.op = words[2];
  f.dtype = words[3];
  f.count = words[4];
  f.root = words[5];
  f.reduce_op = words[6];
  f.pairing = words[7];
  return f;
}

std::string encode_text(const Fingerprint& f) {
  std::string text;
  for (int64_t word : encode(f)) text += (text.empty() ? "" : " ") + std::to_string(word);
  return text;
}

std::optional<Fingerprint> decode_text(const std::string& text) {
  FingerprintWords words{};
  std::istringstream in(text);
  for (int64_t& word : words) {
    if (!(in >> word)) return std::nullopt;
  }
  return decode(words);
}

std::string describe(const Fingerprint& f) {
  const std::string name = f.op == kFinalizeOp           ? "bpl_finalize"
                           : f.op == kFingerprintCheckOp ? "the BPL_DEBUG=detail check before"
                                                         : bpl_collective_name(static_cast<bpl_collective>(f.op));
  std::string text = name + (f.sequence > 0 ? " #" + std::to_string(f.sequence) : "");
  std::string args;
  auto add = [&](const std::string& item) { args += (args.empty() ? "" : ", ") + item; };
  if (f.dtype >= 0) add(bpl_dtype_name(static_cast<bpl_dtype>(f.dtype)));
  if (f.count >= 0) add("count " + std::to_string(f.count));
  if (f.root >= 0) add("root " + std::to_string(f.root));
  if (f.reduce_op >= 0) add(bpl_reduce_op_name(static_cast<bpl_reduce_op>(f.reduce_op)));
  return args.empty() ? text : text + " (" + args + ")";
}

std::string compare(const std::vector<Fingerprint>& all) {
  std::vector<std::pair<int, Fingerprint>> by_rank;
  for (size_t rank = 0; rank < all.size(); ++rank) by_rank.emplace_back(static_cast<int>(rank), all[rank]);
  return compare(by_rank, static_cast<int>(all.size()));
}

std::string disagreement(const std::vector<std::pair<int, std::string>>& call_of_rank) {
  // Distinct calls in order of first appearance, with the ranks that make each.
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (const auto& [rank, call] : call_of_rank) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == call; });
    if (it == groups.end()) {
      groups.push_back({call, {rank}});
    } else {
      it->second.push_back(rank);
    }
  }
  if (groups.size() < 2) return "";
  std::string report;
  for (size_t i = 0; i < groups.size(); ++i) {
    report += (i ? "; " : "") + rank_list(groups[i].second) + (groups[i].second.size() == 1 ? " calls " : " call ") +
              groups[i].first;
  }
  // The most common call (the first on a tie) is the reference; the others are named as differing.
  const auto reference = std::max_element(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    return a.second.size() < b.second.size();
  });
  if (reference->second.size() > 1) {
    std::vector<int> odd;
    for (const auto& g : groups) {
      if (&g != &*reference) odd.insert(odd.end(), g.second.begin(), g.second.end());
    }
    std::sort(odd.begin(), odd.end());
    report += "; " + rank_list(odd) + " differ" + (odd.size() == 1 ? "s" : "") + " from the others";
  }
  return report;
}

std::string compare(const std::vector<std::pair<int, Fingerprint>>& by_rank, int ranks) {
  std::vector<std::pair<int, std::string>> calls;
  for (const auto& [rank, fingerprint] : by_rank) calls.emplace_back(rank, describe(fingerprint));
  const std::string groups = disagreement(calls);
  if (groups.empty()) {
    if (by_rank.empty() || by_rank.size() != static_cast<size_t>(ranks)) return "";
    uint64_t pairing = 0;
    for (const auto& [rank, fingerprint] : by_rank) pairing += static_cast<uint64_t>(fingerprint.pairing);
    if (pairing == 0) return "";
    return "ranks disagree on the counts of " + describe(by_rank.front().second) +
           ": what some rank sends another is not what that one receives from it; differ in: counts";
  }
  std::vector<Fingerprint> all;
  for (const auto& [rank, fingerprint] : by_rank) all.push_back(fingerprint);
  std::vector<std::string> fields;
  auto differs = [&](int64_t Fingerprint::*field) {
    return std::any_of(all.begin(), all.end(), [&](const Fingerprint& f) { return f.*field != all.front().*field; });
  };
  if (differs(&Fingerprint::sequence)) fields.push_back("sequence number");
  if (differs(&Fingerprint::op)) fields.push_back("op");
  if (differs(&Fingerprint::dtype)) fields.push_back("dtype");
  if (differs(&Fingerprint::count)) fields.push_back("count");
  if (differs(&Fingerprint::root)) fields.push_back("root");
  if (differs(&Fingerprint::reduce_op)) fields.push_back("reduce op");
  std::string report = "ranks disagree on the collective they call: " + groups + "; differ in: ";
  for (size_t i = 0; i < fields.size(); ++i) report += (i ? ", " : "") + fields[i];
  return report;
}

}  // namespace backplane
