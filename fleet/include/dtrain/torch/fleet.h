#pragma once
// Deprecated forward (one release): use dtrain/fleet/fleet.h.
#include "dtrain/fleet/fleet.h"
#include "dtrain/torch/deprecated.h"
