// tools/arbiter/devices_command.h — `arbiter devices [--json]`: the compute
// devices this build and machine have (cpu, and every Vulkan device the
// loader finds with its heaps, budget and features).
#pragma once

namespace arbiter::tools {

// Prints the devices; returns the exit status (0, or 1 when --json output
// could not be made). A machine without a Vulkan loader or device lists the
// cpu and says why there is no Vulkan device; that is not an error.
int RunDevices(bool json);

}  // namespace arbiter::tools
