#pragma once
// Deprecated forward (one release): use dtrain/fleet/ps.h.
#include "dtrain/fleet/ps.h"
#include "dtrain/torch/deprecated.h"
