#pragma once
// Deprecated forward (one release): use dtrain/fleet/optimizer.h.
#include "dtrain/fleet/optimizer.h"
#include "dtrain/torch/deprecated.h"
