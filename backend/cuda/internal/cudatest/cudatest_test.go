package cudatest

import (
	"errors"
	"testing"
)

type fakeDevice struct{ closed bool }

func (f *fakeDevice) Close() error { f.closed = true; return nil }

// Get hands out the opened device, and skips (never fails) a test when
// there is none, with the reason.
func TestGet(t *testing.T) {
	dev := &fakeDevice{}
	opened := Device[*fakeDevice]{dev: dev, opened: true}
	if got := opened.Get(t); got != dev {
		t.Fatalf("Get = %p, want the opened device %p", got, dev)
	}
	none := Device[*fakeDevice]{err: errors.New("no GPU here")}
	var skipped bool
	t.Run("none", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		none.Get(t)
		t.Error("Get returned without a device")
	})
	if !skipped {
		t.Error("Get did not skip a test without a device")
	}
	if none.Device() != nil {
		t.Errorf("Device() = %v with no device, want nil", none.Device())
	}
}
