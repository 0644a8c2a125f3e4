// See metrics.h for the series and where each comes from.
#include "server/internal/metrics.h"

#include <prometheus/text_serializer.h>

namespace arbiter::server_internal {

using prometheus::BuildCounter;
using prometheus::BuildGauge;

ServerMetrics::ServerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      loads_(BuildCounter()
                 .Name("arbiter_model_loads_total")
                 .Help("Successful model loads")
                 .Register(*registry_)),
      load_failures_(BuildCounter()
                         .Name("arbiter_model_load_failures_total")
                         .Help("Failed model loads")
                         .Register(*registry_)),
      unloads_(BuildCounter()
                   .Name("arbiter_model_unloads_total")
                   .Help("Model unloads by reason")
                   .Register(*registry_)),
      evictions_(BuildCounter()
                     .Name("arbiter_evictions_total")
                     .Help("Evictions by reason (every unload but shutdown)")
                     .Register(*registry_)),
      http_requests_(BuildCounter()
                         .Name("arbiter_http_requests_total")
                         .Help("HTTP requests by route and status code")
                         .Register(*registry_)),
      pressure_level_(BuildGauge()
                          .Name("arbiter_memory_pressure_level")
                          .Help("Memory pressure level: 0 nominal, 1 low, 2 critical")
                          .Register(*registry_)
                          .Add({})),
      budget_bytes_(BuildGauge()
                        .Name("arbiter_memory_budget_bytes")
                        .Help("Memory budget for models in bytes (0 = unlimited)")
                        .Register(*registry_)
                        .Add({})),
      charged_bytes_(BuildGauge()
                         .Name("arbiter_memory_charged_bytes")
                         .Help("Bytes charged to the memory ledger")
                         .Register(*registry_)
                         .Add({})),
      resident_bytes_(BuildGauge()
                          .Name("arbiter_memory_resident_bytes")
                          .Help("Bytes of loaded models")
                          .Register(*registry_)
                          .Add({})),
      model_resident_(BuildGauge()
                          .Name("arbiter_model_resident")
                          .Help("1 when the model is loaded, else 0")
                          .Register(*registry_)),
      model_bytes_(BuildGauge()
                       .Name("arbiter_model_bytes")
                       .Help("Model size in bytes (measured once loaded, else estimated)")
                       .Register(*registry_)) {}

void ServerMetrics::OnEvent(const ArbiterEvent& e) {
  switch (e.type) {
    case ArbiterEventType::kModelLoad:
      loads_
          .Add({{"model", e.model_key}, {"capability", std::string(CapabilityName(e.capability))}})
          .Increment();
      break;
    case ArbiterEventType::kModelUnload:
      unloads_.Add({{"reason", std::string(UnloadReasonName(e.reason))}}).Increment();
      break;
    case ArbiterEventType::kEviction:
      evictions_.Add({{"reason", std::string(UnloadReasonName(e.reason))}}).Increment();
      break;
    default:
      break;
  }
}

void ServerMetrics::OnHttpRequest(std::string_view route, int status) {
  http_requests_.Add({{"route", std::string(route)}, {"code", std::to_string(status)}})
      .Increment();
}

std::string ServerMetrics::Scrape(const ArbiterStats& s) {
  {
    MutexLock l(&mu_);
    pressure_level_.Set(static_cast<double>(static_cast<int>(s.pressure)));
    budget_bytes_.Set(static_cast<double>(s.budget_bytes));
    charged_bytes_.Set(static_cast<double>(s.charged_bytes));
    resident_bytes_.Set(static_cast<double>(s.resident_bytes));
    for (const ModelStats& m : s.models) {
      const prometheus::Labels labels{{"model", m.name},
                                      {"capability", std::string(CapabilityName(m.capability))}};
      loads_.Add(labels);  // present (0) before the first load
      model_resident_.Add(labels).Set(m.state == ModelState::kLoaded ? 1 : 0);
      model_bytes_.Add(labels).Set(static_cast<double>(m.bytes));
      uint64_t& seen = failures_seen_[m.resident_key];
      prometheus::Counter& failures = load_failures_.Add(labels);
      if (m.load_failures > seen) {
        failures.Increment(static_cast<double>(m.load_failures - seen));
        seen = m.load_failures;
      }
    }
  }
  prometheus::TextSerializer serializer;
  return serializer.Serialize(registry_->Collect());
}

}  // namespace arbiter::server_internal
