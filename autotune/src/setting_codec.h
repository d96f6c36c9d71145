// The text form of a Setting (autotune/README.md "Setting file"): what rank 0 writes to the
// best-setting file and sends to the other ranks in its start data and decisions through the
// store. One codec for both, so a saved file and a decision cannot drift apart.
//
// Private to the autotune library (src/). Pure functions: any thread.
#pragma once

#include <string>

#include "bagua/autotune/autotuner.h"
#include "bagua/base/status.h"

namespace bagua::autotune {

// "bucket_bytes=N", one "knob.<name>=V" per knob, one "bucket=a,b,..." per bucket, each line
// ending in '\n'. The score and the model name are not part of it (saveSetting adds them).
std::string encodeSetting(const Setting& s);

// Reads the lines of `text` back (blank lines and '#' comments skipped; "model=" ignored,
// "score=" read). InvalidArgument naming `where` and the line for an unknown key, a malformed
// line, a non-positive bucket size, an empty bucket, or a missing bucket_bytes / bucket line.
Result<Setting> decodeSetting(const std::string& text, const std::string& where);

}  // namespace bagua::autotune
