// The dashboard's files (GET /ui, /ui/{file}; docs/ui.md), compiled into
// the binary at build time by cmake/embed_assets.cmake from src/server/ui/
// and the pinned uPlot package scripts/install-deps.sh installs: the
// dashboard works offline and never fetches anything from elsewhere.
#pragma once

#include <string_view>
#include <vector>

namespace arbiter::server_internal {

struct UiAsset {
  std::string_view name;          // "index.html", "app.js", "uPlot.iife.min.js", ...
  std::string_view content_type;  // from the extension
  std::string_view body;          // the file's bytes (static storage)
};

// Every embedded file, in a fixed order. Thread-safe (immutable).
const std::vector<UiAsset>& UiAssets();

}  // namespace arbiter::server_internal
