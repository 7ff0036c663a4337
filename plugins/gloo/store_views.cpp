#include "store_views.h"

#include <thread>

namespace backplane::gloo_plugin {

namespace {

class StoreBoard : public FailureBoard {
 public:
  StoreBoard(std::shared_ptr<KvStore> store, std::string prefix) : store_(std::move(store)), prefix_(std::move(prefix)) {}

  std::string record_first(const std::string& key, const std::string& value, std::chrono::milliseconds defer) override {
    try {
      if (defer.count() > 0) store_->wait_for(prefixed(key), defer);
      return text_of(set_first(*store_, prefixed(key), bytes_of(value), kFirstValueWait));
    } catch (const std::exception& e) {
      // Said, as this rank may now name its own view of a failure another rank saw first.
      plugin::log(BPL_LOG_WARN, "gloo", "the job's store did not say what was recorded first under '" + key +
                                            "' (this rank keeps its own): " + e.what());
      return value;
    }
  }

  void publish(const std::string& key, const std::string& value) override {
    try {
      store_->set(prefixed(key), bytes_of(value));
    } catch (const std::exception&) {
      // unreachable: the others will find nothing, as if this rank had not answered
    }
  }

  std::vector<std::optional<std::string>> gather(const std::vector<std::string>& keys,
                                                 std::chrono::milliseconds within) override {
    std::vector<std::optional<std::string>> values(keys.size());
    try {
      const auto give_up = plugin::deadline_after(within);
      for (size_t i = 0; i < keys.size(); ++i) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - std::chrono::steady_clock::now());
        if (store_->wait_for(prefixed(keys[i]), std::max(left, std::chrono::milliseconds(0)))) {
          values[i] = text_of(store_->get(prefixed(keys[i]), kFirstValueWait));
        }
      }
    } catch (const std::exception&) {
      // what was read so far stands
    }
    return values;
  }

 private:
  // How long a value that is known to be set, or about to be, may take to be read.
  static constexpr std::chrono::milliseconds kFirstValueWait{500};
  std::string prefixed(const std::string& key) const { return prefix_ + "/" + key; }
  std::shared_ptr<KvStore> store_;
  std::string prefix_;
};

class InProcessBoard : public FailureBoard {
 public:
  std::string record_first(const std::string&, const std::string& value, std::chrono::milliseconds) override {
    return value;
  }
  void publish(const std::string&, const std::string&) override {}
  std::vector<std::optional<std::string>> gather(const std::vector<std::string>& keys, std::chrono::milliseconds) override {
    return std::vector<std::optional<std::string>>(keys.size());
  }
};

}  // namespace

std::shared_ptr<FailureBoard> make_store_board(std::shared_ptr<KvStore> store, std::string prefix) {
  return std::make_shared<StoreBoard>(std::move(store), std::move(prefix));
}

std::shared_ptr<FailureBoard> make_in_process_board() { return std::make_shared<InProcessBoard>(); }

}  // namespace backplane::gloo_plugin
