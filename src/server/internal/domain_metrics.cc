// See domain_metrics.h for the series.
#include "server/internal/domain_metrics.h"

namespace arbiter::server_internal {

using prometheus::BuildCounter;
using prometheus::BuildGauge;

namespace {

prometheus::Family<prometheus::Gauge>& Gauges(prometheus::Registry& r, const char* name,
                                              const char* help) {
  return BuildGauge().Name(name).Help(help).Register(r);
}

void Advance(prometheus::Counter& c, uint64_t now, uint64_t* seen) {
  if (now > *seen) c.Increment(static_cast<double>(now - *seen));
  *seen = now;
}

}  // namespace

DomainMetrics::DomainMetrics(prometheus::Registry& r)
    : budget_(Gauges(r, "arbiter_memory_domain_budget_bytes",
                     "Memory budget of the domain in bytes (0 = unlimited)")),
      charged_(Gauges(r, "arbiter_memory_domain_charged_bytes",
                      "Bytes charged to the domain (a device inside the host counts in both)")),
      peak_(Gauges(r, "arbiter_memory_domain_peak_bytes",
                   "Largest charged total of the domain since start")),
      runtime_(Gauges(r, "arbiter_memory_domain_runtime_bytes",
                      "The process's own memory in the domain that no model owns")),
      over_budget_(Gauges(r, "arbiter_memory_domain_over_budget_bytes",
                          "Bytes charged past the domain's budget")),
      by_kind_(Gauges(r, "arbiter_memory_domain_charged_by_kind_bytes",
                      "Bytes charged to the domain, by kind")),
      refusals_(BuildCounter()
                    .Name("arbiter_memory_domain_refusals_total")
                    .Help("Charges the domain's budget refused")
                    .Register(r)),
      over_commits_(BuildCounter()
                        .Name("arbiter_memory_domain_over_commits_total")
                        .Help("Unconditional charges that left the domain over its budget")
                        .Register(r)) {}

void DomainMetrics::Update(const MemoryLedgerSnapshot& ledger) {
  for (const auto& [name, d] : ledger.domains) {
    const prometheus::Labels labels{{"domain", name}};
    budget_.Add(labels).Set(static_cast<double>(d.budget_bytes));
    charged_.Add(labels).Set(static_cast<double>(d.charged_bytes));
    peak_.Add(labels).Set(static_cast<double>(d.peak_bytes));
    runtime_.Add(labels).Set(static_cast<double>(d.runtime_bytes));
    over_budget_.Add(labels).Set(static_cast<double>(d.over_budget_bytes));
    for (size_t k = 0; k < kChargeKindCount; ++k) {
      by_kind_
          .Add({{"domain", name}, {"kind", std::string(ChargeKindName(static_cast<ChargeKind>(k)))}})
          .Set(static_cast<double>(d.by_kind[k]));
    }
    Advance(refusals_.Add(labels), d.refusals, &refusals_seen_[name]);
    Advance(over_commits_.Add(labels), d.over_commits, &over_commits_seen_[name]);
  }
}

}  // namespace arbiter::server_internal
