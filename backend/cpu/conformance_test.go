package cpu

import (
	"testing"

	"github.com/flashgraph/flashgraph/backend/backendtest"
)

// TestConformance runs the suite every backend runs; the CPU computes
// bfloat16 in float32 with outputs rounded, so it runs that dtype too.
func TestConformance(t *testing.T) {
	backendtest.Run(t, New, backendtest.DefaultTolerances())
}
