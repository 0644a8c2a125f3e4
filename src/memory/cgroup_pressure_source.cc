// CgroupPressureSource — cgroup v2 memory limit (see the header for policy).
//
// A tick reads the cgroup files outside the lock, then under mu_ compares the
// memory.events counters with the previous tick's (so two concurrent ticks
// cannot both count one OOM), classifies, and records the outgoing event
// (Note [Pressure event ordering]). Counter growth is a one-tick signal: the
// next tick without growth falls back to the fraction-based level.
#include "arbiter/memory/cgroup_pressure_source.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <charconv>

#include "arbiter/base/file.h"
#include "memory/internal/pressure_listeners.h"
#include "memory/internal/pressure_poller.h"

namespace arbiter {
namespace {

std::string_view Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

Result<uint64_t> ParseU64(std::string_view text, const std::string& what) {
  text = Trim(text);
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size()) {
    return DataLossError(what + " is not a number: \"" + std::string(text) + "\"");
  }
  return v;
}

// "max" → nullopt.
Result<std::optional<uint64_t>> ParseLimit(std::string_view text, const std::string& what) {
  if (Trim(text) == "max") return std::optional<uint64_t>();
  ARBITER_ASSIGN_OR_RETURN(uint64_t v, ParseU64(text, what));
  return std::optional<uint64_t>(v);
}

}  // namespace

Result<std::string> ParseCgroupV2Path(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = Trim(text.substr(pos, nl - pos));
    pos = nl + 1;
    if (line.substr(0, 3) == "0::") return std::string(line.substr(3));
  }
  return UnavailableError("no cgroup v2 entry (\"0::/path\") in /proc/self/cgroup");
}

Result<CgroupMemoryEvents> ParseCgroupMemoryEvents(std::string_view text) {
  CgroupMemoryEvents ev;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = Trim(text.substr(pos, nl - pos));
    pos = nl + 1;
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    std::string key(line.substr(0, sp));
    std::string_view value = sp == std::string_view::npos ? std::string_view() : line.substr(sp);
    uint64_t* slot = key == "low"        ? &ev.low
                     : key == "high"     ? &ev.high
                     : key == "max"      ? &ev.max
                     : key == "oom"      ? &ev.oom
                     : key == "oom_kill" ? &ev.oom_kill
                                         : nullptr;
    if (slot == nullptr) continue;  // e.g. oom_group_kill
    ARBITER_ASSIGN_OR_RETURN(*slot, ParseU64(value, "memory.events " + key));
  }
  return ev;
}

Result<CgroupMemoryStats> ReadCgroupMemory(const std::string& dir) {
  auto read = [&](const char* name) -> Result<std::string> {
    auto t = ReadFile(dir + "/" + name, 1 << 16);
    if (!t.ok()) {
      return UnavailableError(std::string("cannot read ") + dir + "/" + name + " (" +
                              t.status().message() +
                              "); the cgroup v2 memory controller is not available here");
    }
    return t;
  };
  CgroupMemoryStats s;
  ARBITER_ASSIGN_OR_RETURN(std::string max_text, read("memory.max"));
  ARBITER_ASSIGN_OR_RETURN(s.max_bytes, ParseLimit(max_text, dir + "/memory.max"));
  ARBITER_ASSIGN_OR_RETURN(std::string cur_text, read("memory.current"));
  ARBITER_ASSIGN_OR_RETURN(s.current_bytes, ParseU64(cur_text, dir + "/memory.current"));
  ARBITER_ASSIGN_OR_RETURN(std::string high_text, read("memory.high"));
  ARBITER_ASSIGN_OR_RETURN(s.high_bytes, ParseLimit(high_text, dir + "/memory.high"));
  ARBITER_ASSIGN_OR_RETURN(std::string ev_text, read("memory.events"));
  auto ev = ParseCgroupMemoryEvents(ev_text);
  if (!ev.ok()) return ev.status().WithPrefix(dir);
  s.events = *ev;
  return s;
}

Result<std::unique_ptr<CgroupPressureSource>> CgroupPressureSource::Create(Options options) {
  options.interval_ms = internal::ClampPollIntervalMs(options.interval_ms);
  ARBITER_RETURN_IF_ERROR(
      internal::NormalizeWatermarks(&options.low_fraction, &options.critical_fraction));
  return std::unique_ptr<CgroupPressureSource>(new CgroupPressureSource(std::move(options)));
}

CgroupPressureSource::CgroupPressureSource(Options options)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : Clock::Real()),
      listeners_(std::make_shared<internal::PressureListeners>(options_.warn)),
      latch_(std::make_unique<internal::PressureLevelLatch>()),
      poller_(std::make_unique<internal::PressurePoller>(options_.id, options_.warn)) {}

CgroupPressureSource::~CgroupPressureSource() { Stop(); }

MemoryPressureSubscription CgroupPressureSource::Subscribe(MemoryPressureListener listener) {
  return listeners_->Subscribe(std::move(listener));
}

std::string CgroupPressureSource::cgroup_dir() const {
  MutexLock l(&mu_);
  return dir_;
}

Result<std::string> CgroupPressureSource::ResolveDir() {
  {
    MutexLock l(&mu_);
    if (!dir_.empty()) return dir_;
  }
  auto text = ReadFile(options_.proc_self_cgroup, 1 << 16);
  if (!text.ok()) {
    return UnavailableError("cannot read " + options_.proc_self_cgroup + " (" +
                            text.status().message() + "); no cgroup to watch");
  }
  ARBITER_ASSIGN_OR_RETURN(std::string path, ParseCgroupV2Path(*text));
  std::string dir = options_.cgroup_root;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (path != "/") dir += path;
  MutexLock l(&mu_);
  dir_ = dir;
  return dir;
}

MemoryPressureEvent CgroupPressureSource::Sample(const std::optional<CgroupMemoryEvents>& prev,
                                                 CgroupMemoryEvents* counters,
                                                 std::string* warning) {
  MemoryPressureEvent e;
  e.source = options_.id;
  e.at_ms = clock_->NowMs();
  auto dir = ResolveDir();
  Result<CgroupMemoryStats> stats = dir.ok() ? ReadCgroupMemory(*dir)
                                             : Result<CgroupMemoryStats>(dir.status());
  if (stats.ok() && !stats->max_bytes) {
    stats = UnavailableError("memory.max is \"max\" (no limit)");
  }
  if (!stats.ok() || *stats->max_bytes == 0) {
    *warning = "memory pressure source " + options_.id + ": bad reading (" +
               (stats.ok() ? std::string("memory.max is 0") : stats.status().ToString()) +
               "); treating as nominal";
    if (prev) *counters = *prev;
    return e;
  }
  uint64_t max = *stats->max_bytes;
  uint64_t free = stats->current_bytes >= max ? 0 : max - stats->current_bytes;
  e.total_bytes = max;
  e.free_bytes = free;
  e.free_fraction = static_cast<double>(free) / static_cast<double>(max);
  e.level = ClassifyFreeFraction(*e.free_fraction, options_.low_fraction,
                                 options_.critical_fraction);
  *counters = stats->events;
  if (prev) {
    const CgroupMemoryEvents& p = *prev;
    const CgroupMemoryEvents& c = stats->events;
    if (c.oom > p.oom || c.oom_kill > p.oom_kill || c.max > p.max) {
      e.level = MemoryPressureLevel::kCritical;
    } else if (c.high > p.high) {
      e.level = WorseLevel(e.level, MemoryPressureLevel::kLow);
    }
  }
  return e;
}

MemoryPressureEvent CgroupPressureSource::Tick() {
  // The counters comparison must see the previous tick's counters; serialize
  // ticks by sampling against a snapshot and re-checking under the lock.
  std::optional<CgroupMemoryEvents> prev;
  {
    MutexLock l(&mu_);
    prev = counters_;
  }
  std::string warning;
  CgroupMemoryEvents counters;
  MemoryPressureEvent e = Sample(prev, &counters, &warning);
  std::optional<internal::PressureListeners::Pending> pending;
  {
    MutexLock l(&mu_);
    counters_ = counters;
    pending = latch_->Offer(e, *listeners_);
  }
  if (!warning.empty()) internal::EmitPressureWarning(options_.warn, warning);
  if (pending) listeners_->Deliver(*pending);
  return e;
}

MemoryPressureEvent CgroupPressureSource::Current() {
  std::optional<CgroupMemoryEvents> prev;
  {
    MutexLock l(&mu_);
    prev = counters_;
  }
  std::string warning;
  CgroupMemoryEvents counters;
  MemoryPressureEvent e = Sample(prev, &counters, &warning);
  if (!warning.empty()) internal::EmitPressureWarning(options_.warn, warning);
  return e;
}

Status CgroupPressureSource::Start() {
  MutexLock lifecycle(&lifecycle_mu_);
  if (running_) return OkStatus();
  ARBITER_ASSIGN_OR_RETURN(std::string dir, ResolveDir());
  ARBITER_ASSIGN_OR_RETURN(CgroupMemoryStats stats, ReadCgroupMemory(dir));
  if (!stats.max_bytes) {
    return UnavailableError("cgroup " + dir +
                            " has no memory limit (memory.max = max); nothing to watch, use "
                            "another memory pressure source");
  }
  int events_fd = ::open((dir + "/memory.events").c_str(), O_RDONLY | O_CLOEXEC);
  // events_fd < 0 is tolerated: the thread then wakes on the interval only.
  if (events_fd >= 0) {
    // Reading the cgroup file once arms kernfs change notification.
    char buf[512];
    (void)::pread(events_fd, buf, sizeof(buf), 0);
  }
  Tick();
  Status started = poller_->Start(
      options_.interval_ms, {pollfd{events_fd, POLLPRI, 0}},
      [this](std::span<pollfd> watches) {
        if (watches[0].revents & (POLLPRI | POLLERR)) {
          char buf[512];
          (void)::pread(watches[0].fd, buf, sizeof(buf), 0);  // re-arm
        }
        Tick();
      });
  if (!started.ok()) {
    if (events_fd >= 0) ::close(events_fd);
    return started;
  }
  events_fd_ = events_fd;
  running_ = true;
  return OkStatus();
}

void CgroupPressureSource::Stop() {
  MutexLock lifecycle(&lifecycle_mu_);
  if (!running_) return;
  poller_->Stop();
  if (events_fd_ >= 0) ::close(events_fd_);
  events_fd_ = -1;
  running_ = false;
}

}  // namespace arbiter
