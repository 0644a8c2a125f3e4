// PsiPressureSource — Linux PSI triggers (see the header for the policy).
//
// Level state machine (all under mu_, events recorded under it per
// Note [Pressure event ordering]):
//   OnTrigger(L): remember the trigger time of L; level = max(level, L).
//   Tick():       floor = critical if a critical trigger fired within quiet_ms,
//                 else low if a low trigger did, else nominal;
//                 avg   = level implied by avg10 values (capped at level);
//                 level = max(floor, avg) when that is lower than level.
// So a trigger raises at once and the level comes down only after a quiet
// window and only as far as the averages allow.
//
// File descriptors: one O_RDWR fd per trigger (the kernel allows one trigger
// per open file), watched by the source's PressurePoller (Note [Polling
// pressure sources] in internal/pressure_poller.h), whose wake-up eventfd
// lets Stop() return at once. The poll thread owns nothing; Start/Stop
// (serialized by lifecycle_mu_) open and close the fds around the thread's
// lifetime.
#include "arbiter/memory/psi_pressure_source.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "arbiter/base/file.h"
#include "memory/internal/pressure_listeners.h"
#include "memory/internal/pressure_poller.h"

namespace arbiter {
namespace {

Status ParsePsiLine(std::string_view kind, std::string_view rest, PsiLine* out) {
  bool have10 = false, have60 = false, have300 = false, have_total = false;
  size_t pos = 0;
  while (pos < rest.size()) {
    while (pos < rest.size() && (rest[pos] == ' ' || rest[pos] == '\t')) ++pos;
    size_t end = pos;
    while (end < rest.size() && rest[end] != ' ' && rest[end] != '\t') ++end;
    std::string_view tok = rest.substr(pos, end - pos);
    pos = end;
    if (tok.empty()) continue;
    size_t eq = tok.find('=');
    if (eq == std::string_view::npos) {
      return DataLossError("PSI \"" + std::string(kind) + "\" line: token \"" + std::string(tok) +
                           "\" is not key=value");
    }
    std::string_view key = tok.substr(0, eq), value = tok.substr(eq + 1);
    auto bad_number = [&] {
      return DataLossError("PSI \"" + std::string(kind) + "\" line: " + std::string(key) +
                           " is not a number: \"" + std::string(value) + "\"");
    };
    if (key == "total") {
      uint64_t v = 0;
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || p != value.data() + value.size() || value.empty()) return bad_number();
      out->total_us = v;
      have_total = true;
      continue;
    }
    double* slot = nullptr;
    if (key == "avg10") {
      slot = &out->avg10;
      have10 = true;
    } else if (key == "avg60") {
      slot = &out->avg60;
      have60 = true;
    } else if (key == "avg300") {
      slot = &out->avg300;
      have300 = true;
    } else {
      continue;  // a field from a newer kernel
    }
    double v = 0;
    auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || p != value.data() + value.size() || value.empty()) return bad_number();
    if (!(v >= 0.0 && v <= 100.0)) {
      return DataLossError("PSI \"" + std::string(kind) + "\" line: " + std::string(key) + "=" +
                           std::string(value) + " is outside [0, 100]");
    }
    *slot = v;
  }
  const char* missing = !have10 ? "avg10" : !have60 ? "avg60" : !have300 ? "avg300"
                        : !have_total ? "total" : nullptr;
  if (missing) {
    return DataLossError("PSI \"" + std::string(kind) + "\" line has no " + missing + " field");
  }
  return OkStatus();
}

Status ValidateTrigger(const char* name, const PsiTrigger& t) {
  if (t.window_us < 500000 || t.window_us > 10000000) {
    return InvalidArgumentError(std::string("pressure.") + name + " \"" + t.ToString() +
                                "\": window_us must be in [500000, 10000000]");
  }
  if (t.stall_us == 0 || t.stall_us > t.window_us) {
    return InvalidArgumentError(std::string("pressure.") + name + " \"" + t.ToString() +
                                "\": stall_us must be in (0, window_us]");
  }
  return OkStatus();
}

}  // namespace

Result<PsiStats> ParsePsi(std::string_view text) {
  PsiStats stats;
  bool have_some = false, have_full = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    size_t start = line.find_first_not_of(" \t\r");
    if (start == std::string_view::npos) continue;
    line = line.substr(start);
    size_t sp = line.find_first_of(" \t");
    std::string_view kind = line.substr(0, sp);
    std::string_view rest = sp == std::string_view::npos ? std::string_view() : line.substr(sp);
    if (kind == "some") {
      if (have_some) return DataLossError("PSI text has two \"some\" lines");
      ARBITER_RETURN_IF_ERROR(ParsePsiLine(kind, rest, &stats.some));
      have_some = true;
    } else if (kind == "full") {
      if (have_full) return DataLossError("PSI text has two \"full\" lines");
      PsiLine full;
      ARBITER_RETURN_IF_ERROR(ParsePsiLine(kind, rest, &full));
      stats.full = full;
      have_full = true;
    } else {
      return DataLossError("PSI text has an unknown line kind \"" + std::string(kind) +
                           "\"; expected \"some\" or \"full\"");
    }
  }
  if (!have_some) return DataLossError("PSI text has no \"some\" line");
  return stats;
}

std::string PsiTrigger::ToString() const {
  return std::string(kind == Kind::kSome ? "some" : "full") + " " + std::to_string(stall_us) +
         " " + std::to_string(window_us);
}

double PsiTrigger::Percent() const {
  return window_us == 0 ? 0.0 : 100.0 * static_cast<double>(stall_us) /
                                    static_cast<double>(window_us);
}

Result<std::unique_ptr<PsiPressureSource>> PsiPressureSource::Create(Options options) {
  ARBITER_RETURN_IF_ERROR(ValidateTrigger("psi_low_trigger", options.low_trigger));
  ARBITER_RETURN_IF_ERROR(ValidateTrigger("psi_critical_trigger", options.critical_trigger));
  if (options.quiet_ms < 0) options.quiet_ms = 0;
  options.check_interval_ms = std::max(options.check_interval_ms, kMinCheckIntervalMs);
  return std::unique_ptr<PsiPressureSource>(new PsiPressureSource(std::move(options)));
}

PsiPressureSource::PsiPressureSource(Options options)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : Clock::Real()),
      listeners_(std::make_shared<internal::PressureListeners>(options_.warn)),
      latch_(std::make_unique<internal::PressureLevelLatch>()),
      poller_(std::make_unique<internal::PressurePoller>(options_.id, options_.warn)) {}

PsiPressureSource::~PsiPressureSource() { Stop(); }

MemoryPressureSubscription PsiPressureSource::Subscribe(MemoryPressureListener listener) {
  return listeners_->Subscribe(std::move(listener));
}

MemoryPressureEvent PsiPressureSource::MakeEventLocked(MemoryPressureLevel level) const {
  MemoryPressureEvent e;
  e.level = level;
  e.source = options_.id;
  e.at_ms = clock_->NowMs();
  return e;
}

MemoryPressureEvent PsiPressureSource::Current() {
  MutexLock l(&mu_);
  return MakeEventLocked(latch_->level());
}

void PsiPressureSource::OnTrigger(MemoryPressureLevel level) {
  if (level == MemoryPressureLevel::kNominal) return;
  std::optional<internal::PressureListeners::Pending> pending;
  {
    MutexLock l(&mu_);
    int64_t now = clock_->NowMs();
    if (level == MemoryPressureLevel::kCritical) {
      last_critical_ms_ = now;
    } else {
      last_low_ms_ = now;
    }
    // Triggers only raise the level.
    if (static_cast<int>(level) <= static_cast<int>(latch_->level())) return;
    pending = latch_->Offer(MakeEventLocked(level), *listeners_);
  }
  if (pending) listeners_->Deliver(*pending);
}

MemoryPressureLevel PsiPressureSource::Tick() {
  {
    MutexLock l(&mu_);
    if (latch_->level() == MemoryPressureLevel::kNominal) return latch_->level();
  }
  // Read outside the lock.
  MemoryPressureLevel by_avg = MemoryPressureLevel::kNominal;
  std::string warning;
  auto text = ReadFile(options_.path, 1 << 16);
  Result<PsiStats> stats = text.ok() ? ParsePsi(*text) : Result<PsiStats>(text.status());
  if (!stats.ok()) {
    warning = "memory pressure source " + options_.id + ": bad reading of " + options_.path +
              " (" + stats.status().ToString() + "); keeping the current level";
  } else {
    double full10 = stats->full ? stats->full->avg10 : 0.0;
    if (full10 >= options_.critical_trigger.Percent()) {
      by_avg = MemoryPressureLevel::kCritical;
    } else if (stats->some.avg10 >= options_.low_trigger.Percent()) {
      by_avg = MemoryPressureLevel::kLow;
    }
  }
  std::optional<internal::PressureListeners::Pending> pending;
  MemoryPressureLevel result;
  {
    MutexLock l(&mu_);
    int64_t now = clock_->NowMs();
    auto recent = [&](const std::optional<int64_t>& t) {
      return t.has_value() && now - *t < options_.quiet_ms;
    };
    MemoryPressureLevel floor = recent(last_critical_ms_) ? MemoryPressureLevel::kCritical
                                : recent(last_low_ms_)    ? MemoryPressureLevel::kLow
                                                          : MemoryPressureLevel::kNominal;
    const MemoryPressureLevel level = latch_->level();
    MemoryPressureLevel target =
        stats.ok() ? WorseLevel(floor, by_avg) : level;  // bad reading: hold
    // The decay check only lowers the level.
    if (static_cast<int>(target) < static_cast<int>(level)) {
      pending = latch_->Offer(MakeEventLocked(target), *listeners_);
    }
    result = latch_->level();
  }
  if (!warning.empty()) internal::EmitPressureWarning(options_.warn, warning);
  if (pending) listeners_->Deliver(*pending);
  return result;
}

namespace {

// Opens `path` and arms `trigger` on it. Returns the fd or kUnavailable.
Result<int> ArmTrigger(const std::string& path, const PsiTrigger& trigger, bool arm) {
  int fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return UnavailableError("PSI triggers are unavailable: cannot open " + path + " (" +
                            std::strerror(err) +
                            "); the kernel lacks PSI or the file is hidden (containers); "
                            "use another memory pressure source");
  }
  if (!arm) return fd;
  std::string text = trigger.ToString();
  // The kernel expects the terminating NUL to be part of the write.
  ssize_t n = ::write(fd, text.c_str(), text.size() + 1);
  if (n < 0) {
    int err = errno;
    ::close(fd);
    return UnavailableError("PSI triggers are unavailable: the kernel refused trigger \"" + text +
                            "\" on " + path + " (" + std::strerror(err) +
                            "); containers and unprivileged processes often cannot arm PSI "
                            "triggers (windows must then be multiples of 2 s); "
                            "use another memory pressure source");
  }
  return fd;
}

}  // namespace

Status PsiPressureSource::Start() {
  MutexLock lifecycle(&lifecycle_mu_);
  if (running_) return OkStatus();
  // The file must exist and parse before we arm anything.
  auto text = ReadFile(options_.path, 1 << 16);
  if (!text.ok()) {
    return UnavailableError("PSI triggers are unavailable: cannot read " + options_.path + " (" +
                            text.status().message() + "); use another memory pressure source");
  }
  auto stats = ParsePsi(*text);
  if (!stats.ok()) return stats.status().WithPrefix(options_.path);

  auto low = ArmTrigger(options_.path, options_.low_trigger, options_.arm_triggers);
  if (!low.ok()) return low.status();
  auto critical = ArmTrigger(options_.path, options_.critical_trigger, options_.arm_triggers);
  if (!critical.ok()) {
    ::close(*low);
    return critical.status();
  }
  // Start() fires a nominal event if nothing has fired yet, so subscribers
  // after Start() get a replay.
  std::optional<internal::PressureListeners::Pending> pending;
  {
    MutexLock l(&mu_);
    if (!latch_->fired()) pending = latch_->Offer(MakeEventLocked(latch_->level()), *listeners_);
  }
  if (pending) listeners_->Deliver(*pending);
  Status started = poller_->Start(
      options_.check_interval_ms,
      {pollfd{*critical, POLLPRI, 0}, pollfd{*low, POLLPRI, 0}},
      [this](std::span<pollfd> triggers) {
        for (size_t i = 0; i < triggers.size(); ++i) {
          const short re = triggers[i].revents;
          const MemoryPressureLevel level =
              i == 0 ? MemoryPressureLevel::kCritical : MemoryPressureLevel::kLow;
          if (re & (POLLERR | POLLNVAL)) {
            // The trigger is gone (e.g. the file was removed): stop polling
            // it, so this warning is written once.
            triggers[i].fd = -1;
            internal::EmitPressureWarning(
                options_.warn, "memory pressure source " + options_.id + ": the " +
                                   std::string(MemoryPressureLevelName(level)) +
                                   " PSI trigger on " + options_.path +
                                   " reported an error; it is no longer polled");
          } else if (re & POLLPRI) {
            OnTrigger(level);
          }
        }
        Tick();
      });
  if (!started.ok()) {
    ::close(*low);
    ::close(*critical);
    return started;
  }
  low_fd_ = *low;
  critical_fd_ = *critical;
  running_ = true;
  return OkStatus();
}

void PsiPressureSource::Stop() {
  MutexLock lifecycle(&lifecycle_mu_);
  if (!running_) return;
  poller_->Stop();
  ::close(low_fd_);
  ::close(critical_fd_);
  low_fd_ = critical_fd_ = -1;
  running_ = false;
}

}  // namespace arbiter
