// [pressure] → CompositePressureSource(OS source, bridge); see pressure.h.
#include "arbiter/runtime/pressure.h"

#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/memory/cgroup_pressure_source.h"
#include "arbiter/memory/meminfo_pressure_source.h"
#include "arbiter/memory/psi_pressure_source.h"

namespace arbiter {
namespace {

PressureWarningSink SpdlogWarn() {
  return [](std::string_view w) { spdlog::warn("pressure: {}", w); };
}

// Creates and starts one OS source. kUnavailable / kDataLoss from Start()
// mean "not available here".
Result<std::unique_ptr<MemoryPressureSource>> MakeOs(PressureSourceKind kind,
                                                     const PressureSettings& s) {
  std::unique_ptr<MemoryPressureSource> src;
  switch (kind) {
    case PressureSourceKind::kCgroup: {
      CgroupPressureSource::Options o;
      o.interval_ms = s.interval_ms;
      o.low_fraction = s.low_fraction;
      o.critical_fraction = s.critical_fraction;
      o.warn = SpdlogWarn();
      ARBITER_ASSIGN_OR_RETURN(src, CgroupPressureSource::Create(std::move(o)));
      break;
    }
    case PressureSourceKind::kPsi: {
      PsiPressureSource::Options o;
      const uint64_t window_us = static_cast<uint64_t>(s.psi_window_ms) * 1000;
      o.low_trigger = {PsiTrigger::Kind::kSome, static_cast<uint64_t>(s.psi_low_stall_ms) * 1000,
                       window_us};
      o.critical_trigger = {PsiTrigger::Kind::kFull,
                            static_cast<uint64_t>(s.psi_critical_stall_ms) * 1000, window_us};
      o.quiet_ms = s.psi_quiet_ms;
      o.warn = SpdlogWarn();
      ARBITER_ASSIGN_OR_RETURN(src, PsiPressureSource::Create(std::move(o)));
      break;
    }
    case PressureSourceKind::kMeminfo: {
      MeminfoPressureSource::Options o;
      o.interval_ms = s.interval_ms;
      o.low_fraction = s.low_fraction;
      o.critical_fraction = s.critical_fraction;
      o.warn = SpdlogWarn();
      ARBITER_ASSIGN_OR_RETURN(src, MeminfoPressureSource::Create(std::move(o)));
      break;
    }
    default:
      return InvalidArgumentError("not an OS pressure source");
  }
  ARBITER_RETURN_IF_ERROR(src->Start());
  return src;
}

bool NotHere(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDataLoss;
}

}  // namespace

Result<ServePressure> MakeServePressure(const PressureSettings& settings) {
  ServePressure out;
  std::unique_ptr<MemoryPressureSource> os;
  if (settings.source == PressureSourceKind::kAuto) {
    for (PressureSourceKind k :
         {PressureSourceKind::kCgroup, PressureSourceKind::kPsi, PressureSourceKind::kMeminfo}) {
      auto made = MakeOs(k, settings);
      if (made.ok()) {
        os = std::move(made).value();
        out.os_source = std::string(PressureSourceKindName(k));
        break;
      }
      if (!NotHere(made.status())) {
        return Status(made.status().code(),
                      fmt::format("[pressure] {}: {}", PressureSourceKindName(k),
                                  made.status().message()));
      }
      if (!out.probe_notes.empty()) out.probe_notes += "; ";
      out.probe_notes +=
          fmt::format("{}: {}", PressureSourceKindName(k), made.status().message());
    }
  } else if (settings.source != PressureSourceKind::kNone) {
    auto made = MakeOs(settings.source, settings);
    if (!made.ok()) {
      return Status(made.status().code(),
                    fmt::format("[pressure].source = \"{}\" cannot be used here: {} (use "
                                "\"auto\" to fall back to what works)",
                                PressureSourceKindName(settings.source),
                                made.status().message()));
    }
    os = std::move(made).value();
    out.os_source = std::string(PressureSourceKindName(settings.source));
  }
  if (!os) out.os_source = "none";

  auto bridge = std::make_unique<BridgePressureSource>("bridge", nullptr, SpdlogWarn());
  out.bridge = bridge.get();
  std::vector<std::unique_ptr<MemoryPressureSource>> children;
  if (os) children.push_back(std::move(os));
  children.push_back(std::move(bridge));
  out.composite = std::make_unique<CompositePressureSource>(std::move(children), "composite",
                                                            nullptr, SpdlogWarn());
  return out;
}

}  // namespace arbiter
