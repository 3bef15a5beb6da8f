// Placeholder: implemented by the io/dtype work.
#include "core/dtype.h"
