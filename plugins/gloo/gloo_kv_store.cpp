#include "gloo_kv_store.h"

#include <algorithm>

#include "plugin_support.h"

namespace backplane::gloo_plugin {

GlooKvStore::GlooKvStore(std::shared_ptr<KvStore> store, std::string prefix, std::chrono::milliseconds timeout)
    : store_(std::move(store)), prefix_(std::move(prefix) + "/"), timeout_(timeout) {}

void GlooKvStore::set(const std::string& key, const std::vector<char>& data) {
  store_->set(prefix_ + key, std::vector<uint8_t>(data.begin(), data.end()));
}

std::vector<char> GlooKvStore::get(const std::string& key) {
  const std::vector<uint8_t> value = store_->get(prefix_ + key, timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void GlooKvStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GlooKvStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto deadline = plugin::deadline_after(timeout);
  for (const std::string& key : keys) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    store_->get(prefix_ + key, std::max(left, std::chrono::milliseconds(1)));
  }
}

}  // namespace backplane::gloo_plugin
