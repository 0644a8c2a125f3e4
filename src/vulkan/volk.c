// volk (libvulkan-volk-dev ships its source as a header): the Vulkan loader
// is opened with dlopen at run time (volkInitialize), so arbiter starts and
// runs on the CPU on a machine without libvulkan.so.1.
#include <volk.c>
