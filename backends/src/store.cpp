#include "meshsim/store.hpp"

#include <algorithm>

#include "meshsim/error.hpp"
#include "store_ops.hpp"

namespace meshsim {

namespace {
std::string missing_list(const std::vector<std::string>& keys) {
  std::string s;
  for (std::size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 8) s += ", ... (" + std::to_string(keys.size()) + " keys)";
  return s;
}
}  // namespace

void InProcessStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard lk(mu_);
    kv_[key] = value;
  }
  cv_.notify_all();
}

std::string InProcessStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  std::lock_guard lk(mu_);
  auto it = kv_.find(key);
  if (it == kv_.end()) throw NotFound("store: key '" + key + "' was removed while it was read");
  return it->second;
}

void InProcessStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  auto missing = [&] {
    std::vector<std::string> m;
    for (const auto& k : keys) {
      if (!kv_.count(k)) m.push_back(k);
    }
    return m;
  };
  if (!cv_.wait_for(lk, timeout, [&] { return missing().empty(); })) {
    throw DeadlineExceeded("store: waited " + std::to_string(timeout.count()) +
                           " ms for keys " + missing_list(missing()));
  }
}

int64_t InProcessStore::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard lk(mu_);
    v = detail::add_to(kv_, key, delta);
  }
  cv_.notify_all();
  return v;
}

std::string InProcessStore::compare_set(const std::string& key, const std::string& expected,
                                        const std::string& desired) {
  std::string v;
  {
    std::lock_guard lk(mu_);
    v = detail::compare_set_in(kv_, key, expected, desired);
  }
  cv_.notify_all();
  return v;
}

bool InProcessStore::remove(const std::string& key) {
  std::lock_guard lk(mu_);
  return kv_.erase(key) > 0;
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  if (!base_) throw InvalidArgument("PrefixStore: no base store");
}
void PrefixStore::set(const std::string& key, const std::string& value) { base_->set(k(key), value); }
std::string PrefixStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return base_->get(k(key), timeout);
}
void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& key : keys) full.push_back(k(key));
  base_->wait(full, timeout);
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) { return base_->add(k(key), delta); }
std::string PrefixStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  return base_->compare_set(k(key), expected, desired);
}
bool PrefixStore::remove(const std::string& key) { return base_->remove(k(key)); }

}  // namespace meshsim
