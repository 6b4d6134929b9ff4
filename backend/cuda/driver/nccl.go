package driver

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/ebitengine/purego"
)

// NCCL, loaded at run time like the other CUDA libraries: a build of flashgraph
// needs no NCCL, and only data parallel training asks for it.
//
// One API choice is forced by purego: ncclCommInitRank takes its 128-byte
// ncclUniqueId by value, which on x86-64 means sixteen words on the stack, more
// than purego can pass. ncclCommInitRankScalable (NCCL 2.23 and later) takes
// the ids by pointer and with one id and a nil config does the same thing, so
// that is the one called; an older NCCL gets an error that says so.

// ncclAPI holds the NCCL entry points.
type ncclAPI struct {
	lib                                  *library
	ncclGetVersion, ncclGetUniqueId      uintptr
	ncclCommInitRankScalable             uintptr // 0 before NCCL 2.23
	ncclAllReduce, ncclCommDestroy       uintptr
	ncclCommAbort, ncclCommGetAsyncError uintptr
	errorString                          func(int32) string
	lastError                            func(uintptr) string // nil when the library lacks it
	version                              int
}

// ncclNeed is what every NCCL loading error ends with, so that a user who never
// asked for NCCL by name learns why it is wanted.
const ncclNeed = "NCCL is needed for multi-GPU training (install the libnccl2 package, or put the directory holding libnccl.so.2 on LD_LIBRARY_PATH); one GPU needs no NCCL"

var ncclLoad loadOnce[*ncclAPI]

func loadNCCL() (*ncclAPI, error) {
	return ncclLoad.get(func() (*ncclAPI, error) {
		lib, err := openLibrary("NCCL (libnccl.so.2)", "libnccl.so.2", "libnccl.so")
		if err != nil {
			return nil, fmt.Errorf("cuda: %w: %s", err, ncclNeed)
		}
		api := &ncclAPI{lib: lib}
		var errStr uintptr
		err = lib.symbols(map[string]*uintptr{
			"ncclGetVersion":        &api.ncclGetVersion,
			"ncclGetUniqueId":       &api.ncclGetUniqueId,
			"ncclAllReduce":         &api.ncclAllReduce,
			"ncclCommDestroy":       &api.ncclCommDestroy,
			"ncclCommAbort":         &api.ncclCommAbort,
			"ncclCommGetAsyncError": &api.ncclCommGetAsyncError,
			"ncclGetErrorString":    &errStr,
		})
		if err != nil {
			return nil, fmt.Errorf("cuda: %w: %s", err, ncclNeed)
		}
		purego.RegisterFunc(&api.errorString, errStr)
		if p := lib.optionalSymbol("ncclGetLastError"); p != 0 {
			purego.RegisterFunc(&api.lastError, p)
		}
		api.ncclCommInitRankScalable = lib.optionalSymbol("ncclCommInitRankScalable")
		var v int32
		if err := api.check("ncclGetVersion", ccall(api.ncclGetVersion, uintptr(unsafe.Pointer(&v))), 0); err != nil {
			return nil, err
		}
		api.version = int(v)
		return api, nil
	})
}

// ncclResultNames are the ncclResult_t values of nccl.h.
var ncclResultNames = map[int32]string{
	0: "ncclSuccess",
	1: "ncclUnhandledCudaError",
	2: "ncclSystemError",
	3: "ncclInternalError",
	4: "ncclInvalidArgument",
	5: "ncclInvalidUsage",
	6: "ncclRemoteError",
	7: "ncclInProgress",
}

// check turns an ncclResult_t into an *Error with NCCL's description and, when
// comm is known and the library has it, NCCL's last error message (which says
// which peer or which transport failed).
func (api *ncclAPI) check(call string, r int32, comm uintptr) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: call, Code: int(r), Name: ncclResultNames[r]}
	if e.Name == "" {
		e.Name = fmt.Sprintf("ncclResult %d", r)
	}
	e.Desc = api.errorString(r)
	if api.lastError != nil {
		if msg := api.lastError(comm); msg != "" {
			e.Desc += ": " + msg
		}
	}
	return e
}

// NCCLVersion returns the loaded NCCL's version code (e.g. 22703 for 2.27.3),
// or the error that says why NCCL cannot be used.
func NCCLVersion() (int, error) {
	api, err := loadNCCL()
	if err != nil {
		return 0, err
	}
	return api.version, nil
}

// DeviceCount returns how many CUDA devices the driver sees: the most ranks of
// a data parallel job that one host can run.
func DeviceCount() (int, error) {
	api, err := loadDriver()
	if err != nil {
		return 0, err
	}
	n, err := api.deviceCount()
	if err != nil {
		return 0, fmt.Errorf("cuda: %w", err)
	}
	return n, nil
}

// NCCLUniqueID names one NCCL communicator. Rank 0 makes it with
// NewNCCLUniqueID and hands it to every other rank (through dist.Rendezvous),
// and each rank passes it to Device.NewComm.
type NCCLUniqueID [128]byte

// NewNCCLUniqueID makes a fresh communicator id. It opens a bootstrap socket on
// this host (NCCL_SOCKET_IFNAME picks the interface), so only rank 0 calls it.
func NewNCCLUniqueID() (NCCLUniqueID, error) {
	var id NCCLUniqueID
	api, err := loadNCCL()
	if err != nil {
		return id, err
	}
	return id, api.check("ncclGetUniqueId", ccall(api.ncclGetUniqueId, uintptr(unsafe.Pointer(&id[0]))), 0)
}

// Comm is this process's rank of an NCCL communicator, bound to one Device:
// its collectives are queued on the device's stream, ordered with the kernels
// that produce and consume their buffers.
type Comm struct {
	api         *ncclAPI
	dev         *Device
	comm        atomic.Uintptr // ncclComm_t; 0 once closed or aborted
	rank, world int
}

// NewComm joins the communicator id as rank of world on this device. It
// blocks until all world ranks have called it (NCCL's own bootstrap, over the
// address inside id), so every rank must call it with the same id and world.
func (d *Device) NewComm(id NCCLUniqueID, world, rank int) (*Comm, error) {
	if world < 1 || rank < 0 || rank >= world {
		return nil, fmt.Errorf("cuda: NewComm: rank %d is outside [0, %d)", rank, world)
	}
	api, err := loadNCCL()
	if err != nil {
		return nil, err
	}
	if api.ncclCommInitRankScalable == 0 {
		return nil, fmt.Errorf("cuda: NCCL %s at %s lacks ncclCommInitRankScalable: flashgraph needs NCCL 2.23 or later (ncclCommInitRank takes its id by value, which purego cannot pass)", ncclVersionString(api.version), api.lib.name)
	}
	c := &Comm{api: api, dev: d, rank: rank, world: world}
	var comm uintptr
	err = d.do(func() error {
		// The primary context is current on the device goroutine, so NCCL's
		// runtime calls see this device. A nil config is NCCL's default
		// (blocking) one.
		return api.check("ncclCommInitRankScalable", ccall(api.ncclCommInitRankScalable,
			uintptr(unsafe.Pointer(&comm)), uintptr(world), uintptr(rank), 1, uintptr(unsafe.Pointer(&id[0])), 0), 0)
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d joining NCCL communicator as rank %d of %d: %w", d.ordinal, rank, world, err)
	}
	c.comm.Store(comm)
	return c, nil
}

func ncclVersionString(v int) string {
	if v >= 10000 { // since 2.9: major*10000 + minor*100 + patch
		return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
	}
	return fmt.Sprintf("%d.%d.%d", v/1000, v/100%10, v%100)
}

// Device is the device the communicator is bound to.
func (c *Comm) Device() *Device { return c.dev }

// Rank and World are this communicator's rank and size.
func (c *Comm) Rank() int  { return c.rank }
func (c *Comm) World() int { return c.world }

// ncclDataType_t values of nccl.h for the GemmTypes that gradients have.
func ncclDataType(t GemmType) (uintptr, error) {
	switch t {
	case GemmF32:
		return 7, nil // ncclFloat32
	case GemmF16:
		return 6, nil // ncclFloat16
	case GemmBF16:
		return 9, nil // ncclBfloat16
	}
	return 0, fmt.Errorf("cuda: NCCL: unknown element type %v", t)
}

// ncclRedOp_t values of nccl.h: ncclAvg (NCCL 2.10 and later, below the
// 2.23 NewComm requires) divides the sum by the number of ranks inside the
// collective, so a mean costs no kernel of ours.
const (
	ncclSum = 0
	ncclAvg = 4
)

// AllReduceSum sums count elements of type t at send over every rank into recv
// on every rank (send == recv reduces in place). It is queued on the device's
// stream and returns once queued; the result is there for the work queued
// after it. Every rank must make the same calls in the same order.
func (c *Comm) AllReduceSum(t GemmType, send, recv DevicePtr, count int) error {
	return c.allReduce("AllReduceSum", ncclSum, t, send, recv, count)
}

// AllReduceMean is AllReduceSum divided by the number of ranks (ncclAvg):
// data parallel training's gradient average.
func (c *Comm) AllReduceMean(t GemmType, send, recv DevicePtr, count int) error {
	return c.allReduce("AllReduceMean", ncclAvg, t, send, recv, count)
}

func (c *Comm) allReduce(what string, op uintptr, t GemmType, send, recv DevicePtr, count int) error {
	comm := c.comm.Load()
	if comm == 0 {
		return fmt.Errorf("cuda: %s on a closed NCCL communicator", what)
	}
	dt, err := ncclDataType(t)
	if err != nil {
		return err
	}
	if count < 0 {
		return fmt.Errorf("cuda: %s: negative count %d", what, count)
	}
	if count == 0 {
		return nil
	}
	err = c.dev.do(func() error {
		return c.api.check("ncclAllReduce", ccall(c.api.ncclAllReduce,
			uintptr(send), uintptr(recv), uintptr(count), dt, op, comm, c.dev.stream), comm)
	})
	if err != nil {
		return fmt.Errorf("cuda: rank %d of %d: %s all-reduce of %d elements: %w", c.rank, c.world, t, count, err)
	}
	return nil
}

// AsyncError reports an error NCCL hit in the background (a peer that died
// mid-collective shows up here as ncclRemoteError or ncclSystemError).
func (c *Comm) AsyncError() error {
	comm := c.comm.Load()
	if comm == 0 {
		return nil
	}
	var r int32
	if err := c.api.check("ncclCommGetAsyncError", ccall(c.api.ncclCommGetAsyncError, comm, uintptr(unsafe.Pointer(&r))), comm); err != nil {
		return err
	}
	return c.api.check("NCCL (asynchronous)", r, comm)
}

// Abort tears the communicator down without waiting for the other ranks, and
// makes collectives that wait on a dead peer return: it is what a rank calls
// when dist.Group.Failed reports that another rank died. It may be called from
// any goroutine, even while the device goroutine is inside a collective.
func (c *Comm) Abort() error {
	comm := c.comm.Swap(0)
	if comm == 0 {
		return nil
	}
	return c.api.check("ncclCommAbort", ccall(c.api.ncclCommAbort, comm), 0)
}

// Close waits for the communicator's queued work and frees it.
func (c *Comm) Close() error {
	comm := c.comm.Swap(0)
	if comm == 0 {
		return nil
	}
	return c.dev.do(func() error {
		return c.api.check("ncclCommDestroy", ccall(c.api.ncclCommDestroy, comm), 0)
	})
}
