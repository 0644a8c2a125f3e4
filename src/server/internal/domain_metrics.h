// server/internal/domain_metrics.h — the per-domain memory series of
// GET /metrics (Note [Memory domains] in arbiter/memory/memory_ledger.h).
//
// The host-only series (arbiter_memory_budget_bytes, _charged_bytes,
// _runtime_bytes, arbiter_memory_charged_by_kind_bytes{kind}) keep their
// names and labels; these carry a `domain` label ("host", "vulkan:0", ...)
// and cover every domain, the host included:
//   arbiter_memory_domain_budget_bytes{domain}      0 = unlimited
//   arbiter_memory_domain_charged_bytes{domain}     Σ live charges (a domain
//                                                   inside the host is also
//                                                   in the host's)
//   arbiter_memory_domain_peak_bytes{domain}
//   arbiter_memory_domain_runtime_bytes{domain}     own memory no charge covers
//   arbiter_memory_domain_over_budget_bytes{domain}
//   arbiter_memory_domain_charged_by_kind_bytes{domain,kind}
//   arbiter_memory_domain_refusals_total{domain}    refused TryCharge/Resize
//   arbiter_memory_domain_over_commits_total{domain}
//
// Thread safety: thread-compatible; ServerMetrics calls Update() under its
// own mutex.
#pragma once

#include <map>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "arbiter/memory/memory_ledger.h"

namespace arbiter::server_internal {

class DomainMetrics {
 public:
  // Registers the families in `registry`, which must outlive this.
  explicit DomainMetrics(prometheus::Registry& registry);
  // Sets every series from `ledger.domains`; counters advance by the change
  // of the ledger's cumulative figures since the previous call.
  void Update(const MemoryLedgerSnapshot& ledger);

 private:
  prometheus::Family<prometheus::Gauge>& budget_;
  prometheus::Family<prometheus::Gauge>& charged_;
  prometheus::Family<prometheus::Gauge>& peak_;
  prometheus::Family<prometheus::Gauge>& runtime_;
  prometheus::Family<prometheus::Gauge>& over_budget_;
  prometheus::Family<prometheus::Gauge>& by_kind_;
  prometheus::Family<prometheus::Counter>& refusals_;
  prometheus::Family<prometheus::Counter>& over_commits_;
  // The cumulative figures of the previous Update(), per domain.
  std::map<std::string, uint64_t> refusals_seen_;
  std::map<std::string, uint64_t> over_commits_seen_;
};

}  // namespace arbiter::server_internal
