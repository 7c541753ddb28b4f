// Built only with FLASHCUTE_STATIC_LIBSTDCXX. GCC 12's libstdc++.a, built against glibc 2.36,
// reaches arc4random (new in glibc 2.36) from std::random_device, which the static copy drags in
// with its string instantiations although nothing here constructs one. That single reference would
// raise the library's glibc floor from 2.34 to 2.36 (manylinux_2_36). This hidden definition,
// over getrandom (glibc 2.25), satisfies it inside the library, so the wheel keeps the floor of
// everything else it uses.
#include <sys/random.h>

#include <cstdint>

extern "C" __attribute__((visibility("hidden"))) uint32_t arc4random(void) {
  uint32_t value = 0;
  // getrandom with no flags blocks only until the kernel's pool is first initialised.
  while (getrandom(&value, sizeof(value), 0) != sizeof(value)) {
  }
  return value;
}
