// Typed errors the engine raises for problems a user can cause: each carries a one-line
// message a user can act on. The engine never aborts; callers catch granule::Error.
#pragma once
#include <stdexcept>
#include <string>

namespace granule {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A model file that is not valid GGUF (truncated, bad magic, offsets past the end, ...).
class FormatError : public Error {
  using Error::Error;
};
// A valid file the engine cannot run (unknown architecture, block type, template).
class UnsupportedError : public Error {
  using Error::Error;
};
// A request that does not fit: prompt longer than the context, budget too small.
class CapacityError : public Error {
  using Error::Error;
};
// A failure of the device or driver (CUDA error), turned into a message.
class DeviceError : public Error {
  using Error::Error;
};
// A device failure that leaves the device unusable until it is reset (a sticky CUDA error:
// an illegal address, a kernel trap). The engine ends every conversation with it and
// refuses new ones; destroying the engine resets the device, so the model can be reloaded.
class DeviceLostError : public DeviceError {
  using DeviceError::DeviceError;
};
// A caller's mistake: bad argument, unknown id.
class UsageError : public Error {
  using Error::Error;
};

}  // namespace granule
