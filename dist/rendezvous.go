package dist

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// MaxBlob bounds one rank's blob: the rendezvous carries ids and fingerprints
// (an NCCL unique id is 128 bytes), never data, and a length read off the wire
// must not make a rank allocate without limit.
const MaxBlob = 1 << 20

// Wire format, all integers big-endian:
//
//	hello (rank r → rank 0): "FGR1" u32 rank u32 worldSize u32 len blob
//	reply (rank 0 → rank r): 'K' then worldSize × (u32 len blob)   — everyone arrived
//	                         'E' u32 len message                   — the rendezvous failed
//	afterwards, either way:  'B'                                   — clean shutdown (Close)
//	                         'A' u32 len message                   — abort: a rank died
//
// After the reply the connections stay open for the whole job: they are how a
// rank learns that another one died (see Group.Failed).
var helloMagic = [4]byte{'F', 'G', 'R', '1'}

const (
	msgOK    = 'K'
	msgError = 'E'
	msgBye   = 'B'
	msgAbort = 'A'
)

// keepAlive makes a peer whose host vanished (no FIN, no RST) count as dead
// after about 15 s instead of the kernel's default of hours.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 5 * time.Second, Count: 2}

// verdictGrace is how much longer than rank 0 the other ranks wait.
const verdictGrace = 2 * time.Second

// dialRetry is the pause between attempts to reach rank 0, which may start later.
const dialRetry = 100 * time.Millisecond

// Group is a job's ranks after the rendezvous: every rank's blob, and open
// connections to the other ranks that report when one of them dies.
type Group struct {
	Config
	Blobs [][]byte // Blobs[r] is what rank r passed to Rendezvous

	conns   map[int]net.Conn // rank 0: every other rank; others: rank 0 only
	failed  chan error       // receives the first failure, then stays quiet
	causeMu sync.Mutex
	cause   error // the first failure seen, which every report repeats
	closing atomic.Bool
	mu      sync.Mutex // serialises writes of control messages
	wg      sync.WaitGroup
}

// Rendezvous meets the other ranks of c's job and exchanges blobs: every rank
// passes its own blob and gets back every rank's, indexed by rank. Rank 0
// listens on c.MasterPort (all interfaces) and the others dial c.Address,
// retrying while rank 0 is not up yet. It fails with an error naming the
// missing ranks, rather than waiting forever, when the job has not met within
// timeout or ctx is done; and it fails on every rank when two processes claim
// one rank or disagree on the world size.
//
// A world of one meets no one and returns at once.
func Rendezvous(ctx context.Context, c Config, blob []byte, timeout time.Duration) (*Group, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if len(blob) > MaxBlob {
		return nil, fmt.Errorf("dist: blob of %d bytes is over the limit of %d", len(blob), MaxBlob)
	}
	if timeout <= 0 {
		return nil, fmt.Errorf("dist: rendezvous timeout must be positive, got %v", timeout)
	}
	g := &Group{Config: c, conns: map[int]net.Conn{}, failed: make(chan error, 1)}
	if c.WorldSize == 1 {
		g.Blobs = [][]byte{slices.Clone(blob)}
		return g, nil
	}
	// The other ranks wait a little longer than rank 0, so that when someone
	// is missing they hear rank 0's verdict naming them instead of timing out
	// on their own with less to say.
	wait := timeout
	if c.Rank != 0 {
		wait += verdictGrace
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var err error
	if c.Rank == 0 {
		err = g.serve(ctx, blob, timeout)
	} else {
		err = g.join(ctx, blob, timeout)
	}
	if err != nil {
		for _, conn := range g.conns {
			conn.Close()
		}
		return nil, err
	}
	for r, conn := range g.conns {
		conn.SetDeadline(time.Time{})
		g.wg.Add(1)
		go g.watch(r, conn)
	}
	return g, nil
}

// arrival is one dialled connection's hello, or why it was not one.
type arrival struct {
	conn  net.Conn
	rank  int
	world int
	blob  []byte
	err   error
}

func (g *Group) serve(ctx context.Context, blob []byte, timeout time.Duration) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort("", strconv.Itoa(g.MasterPort)))
	if err != nil {
		return fmt.Errorf("dist: rank 0 cannot listen on port %d: %w (is another job using it? pick another -master-port)", g.MasterPort, err)
	}
	defer ln.Close()
	// Closing the listener is what ends Accept when ctx is done.
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()

	arrivals := make(chan arrival)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				a := readHello(conn)
				select {
				case arrivals <- a:
				case <-ctx.Done():
					conn.Close()
				}
			}()
		}
	}()

	blobs := make([][]byte, g.WorldSize)
	blobs[0] = slices.Clone(blob)
	for len(g.conns) < g.WorldSize-1 {
		select {
		case <-ctx.Done():
			err := fmt.Errorf("dist: rendezvous on port %d timed out after %v: %s never arrived (did they start? is MASTER_ADDR reachable from them?)", g.MasterPort, timeout, missing(g.conns, g.WorldSize))
			if ctx.Err() == context.Canceled {
				err = fmt.Errorf("dist: rendezvous cancelled with %s still missing", missing(g.conns, g.WorldSize))
			}
			g.refuseAll(err)
			return err
		case a := <-arrivals:
			if a.err != nil {
				// Not one of ours (a port scanner, a stale job): ignore it.
				a.conn.Close()
				continue
			}
			var bad error
			switch {
			case a.world != g.WorldSize:
				bad = fmt.Errorf("dist: rank %d (%s) says the world size is %d but rank 0 says %d: every rank needs the same -world-size / %s", a.rank, a.conn.RemoteAddr(), a.world, g.WorldSize, EnvWorldSize)
			case a.rank <= 0 || a.rank >= g.WorldSize:
				bad = fmt.Errorf("dist: a process at %s claims rank %d, outside [1, %d)", a.conn.RemoteAddr(), a.rank, g.WorldSize)
			case g.conns[a.rank] != nil:
				bad = fmt.Errorf("dist: two processes claim rank %d (%s and %s): give each a different -rank / %s", a.rank, g.conns[a.rank].RemoteAddr(), a.conn.RemoteAddr(), EnvRank)
			}
			if bad != nil {
				writeMsg(a.conn, msgError, []byte(bad.Error()))
				a.conn.Close()
				g.refuseAll(bad)
				return bad
			}
			g.conns[a.rank] = a.conn
			blobs[a.rank] = a.blob
		}
	}
	reply := []byte{msgOK}
	for _, b := range blobs {
		reply = binary.BigEndian.AppendUint32(reply, uint32(len(b)))
		reply = append(reply, b...)
	}
	for r, conn := range g.conns {
		conn.SetWriteDeadline(time.Now().Add(timeout))
		if _, err := conn.Write(reply); err != nil {
			err = fmt.Errorf("dist: rank %d (%s) went away during the rendezvous: %w", r, conn.RemoteAddr(), err)
			g.refuseAll(err)
			return err
		}
	}
	g.Blobs = blobs
	return nil
}

// refuseAll tells every rank that has arrived that the rendezvous failed.
func (g *Group) refuseAll(err error) {
	for _, conn := range g.conns {
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		writeMsg(conn, msgError, []byte(err.Error()))
	}
}

// missing lists the ranks in [1, world) that have no connection.
func missing(conns map[int]net.Conn, world int) string {
	var m []int
	for r := 1; r < world; r++ {
		if conns[r] == nil {
			m = append(m, r)
		}
	}
	if len(m) == 1 {
		return fmt.Sprintf("rank %d", m[0])
	}
	return fmt.Sprintf("ranks %v", m)
}

func readHello(conn net.Conn) arrival {
	a := arrival{conn: conn}
	// A real rank writes its hello right after connecting.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var hdr [16]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		a.err = err
		return a
	}
	if [4]byte(hdr[:4]) != helloMagic {
		a.err = errors.New("not a flashgraph rendezvous hello")
		return a
	}
	a.rank = int(binary.BigEndian.Uint32(hdr[4:]))
	a.world = int(binary.BigEndian.Uint32(hdr[8:]))
	n := binary.BigEndian.Uint32(hdr[12:])
	if n > MaxBlob {
		a.err = fmt.Errorf("blob of %d bytes is over the limit", n)
		return a
	}
	a.blob = make([]byte, n)
	if _, err := io.ReadFull(conn, a.blob); err != nil {
		a.err = err
	}
	return a
}

func (g *Group) join(ctx context.Context, blob []byte, timeout time.Duration) error {
	addr := g.Address()
	var conn net.Conn
	var lastErr error
	for conn == nil {
		d := net.Dialer{KeepAliveConfig: keepAlive}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			conn = c
			break
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("dist: rank %d could not reach rank 0 at %s within %v: %v (did rank 0 start? is -master-addr / %s right?)", g.Rank, addr, timeout, lastErr, EnvMasterAddr)
		case <-time.After(dialRetry):
		}
	}
	g.conns[0] = conn
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	hello := append([]byte(nil), helloMagic[:]...)
	hello = binary.BigEndian.AppendUint32(hello, uint32(g.Rank))
	hello = binary.BigEndian.AppendUint32(hello, uint32(g.WorldSize))
	hello = binary.BigEndian.AppendUint32(hello, uint32(len(blob)))
	hello = append(hello, blob...)
	if _, err := conn.Write(hello); err != nil {
		return fmt.Errorf("dist: rank %d: sending to rank 0 at %s: %w", g.Rank, addr, err)
	}
	lost := func(err error) error {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("dist: rank %d: rank 0 at %s closed the connection before the rendezvous finished (did it exit?)", g.Rank, addr)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("dist: rank %d: rank 0 at %s did not complete the rendezvous within %v (are all %d ranks started?)", g.Rank, addr, timeout, g.WorldSize)
		}
		return fmt.Errorf("dist: rank %d: rendezvous with rank 0 at %s: %w", g.Rank, addr, err)
	}
	var kind [1]byte
	if _, err := io.ReadFull(conn, kind[:]); err != nil {
		return lost(err)
	}
	switch kind[0] {
	case msgError:
		msg, err := readBytes(conn)
		if err != nil {
			return lost(err)
		}
		return fmt.Errorf("dist: rank %d: rank 0 refused the rendezvous: %s", g.Rank, msg)
	case msgOK:
	default:
		return fmt.Errorf("dist: rank %d: %s answered with message %q: is it a flashgraph rank 0 of the same version?", g.Rank, addr, kind[0])
	}
	g.Blobs = make([][]byte, g.WorldSize)
	for r := range g.Blobs {
		b, err := readBytes(conn)
		if err != nil {
			return lost(err)
		}
		g.Blobs[r] = b
	}
	return nil
}

// readBytes reads a u32 length and that many bytes (at most MaxBlob).
func readBytes(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > MaxBlob {
		return nil, fmt.Errorf("message of %d bytes is over the limit of %d", size, MaxBlob)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

func writeMsg(w io.Writer, kind byte, payload []byte) error {
	b := []byte{kind}
	if kind != msgBye {
		b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
		b = append(b, payload...)
	}
	_, err := w.Write(b)
	return err
}

// watch reads rank r's connection until it ends. A 'B' before the end is a
// clean Close; anything else (EOF, reset, keepalive timeout) means r died.
// Rank 0 passes the news on to the other ranks so that their error names the
// rank that died, not just rank 0.
func (g *Group) watch(r int, conn net.Conn) {
	defer g.wg.Done()
	var kind [1]byte
	_, err := io.ReadFull(conn, kind[:])
	if g.closing.Load() {
		return
	}
	var fail error
	switch {
	case err == nil && kind[0] == msgBye:
		return
	case err == nil && kind[0] == msgAbort:
		msg, rerr := readBytes(conn)
		if rerr != nil {
			msg = []byte("(message lost)")
		}
		fail = fmt.Errorf("dist: rank %d: the job is aborting: %s", g.Rank, msg)
	case err == nil:
		fail = fmt.Errorf("dist: rank %d: unexpected message %q from rank %d", g.Rank, kind[0], r)
	default:
		fail = fmt.Errorf("dist: rank %d (%s) went away without closing: it died or its host is unreachable (%v)", r, conn.RemoteAddr(), err)
	}
	// The first failure is the cause. Rank 0 records it before passing it
	// on (the others exit when they hear of it, and their connections
	// ending must not replace it), and delivers it only after passing it on
	// (a caller that exits on it must not cut the message off).
	g.causeMu.Lock()
	if g.cause == nil {
		g.cause = fail
	}
	fail = g.cause
	g.causeMu.Unlock()
	if g.Rank == 0 {
		g.broadcastAbort(r, fail)
	}
	select {
	case g.failed <- fail:
	default:
	}
}

// broadcastAbort tells every rank other than dead that the job is over.
func (g *Group) broadcastAbort(dead int, why error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for r, conn := range g.conns {
		if r == dead {
			continue
		}
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		writeMsg(conn, msgAbort, []byte(why.Error()))
	}
}

// Cause is the first failure the group heard of (nil while there is none):
// what Failed delivered, for a caller that did not keep it.
func (g *Group) Cause() error {
	g.causeMu.Lock()
	defer g.causeMu.Unlock()
	return g.cause
}

// Failed receives one error when another rank of the job dies or the job
// aborts. A training loop selects on it (or polls it between steps) and exits
// with the error: a collective with a dead peer would otherwise wait forever.
// It never fires for a world of one or after Close.
func (g *Group) Failed() <-chan error { return g.failed }

// Abort tells the other ranks that this one is giving up, with why, and closes
// the connections. Rank 0's message reaches every rank; another rank's reaches
// rank 0, which passes it on.
func (g *Group) Abort(why error) {
	if g.closing.Swap(true) {
		return
	}
	g.mu.Lock()
	for _, conn := range g.conns {
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		writeMsg(conn, msgAbort, fmt.Appendf(nil, "rank %d: %v", g.Rank, why))
		conn.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
}

// Close ends the group cleanly: the other ranks see a goodbye, not a death.
func (g *Group) Close() error {
	if g.closing.Swap(true) {
		return nil
	}
	g.mu.Lock()
	var errs []error
	for _, conn := range g.conns {
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		writeMsg(conn, msgBye, nil)
		errs = append(errs, conn.Close())
	}
	g.mu.Unlock()
	g.wg.Wait()
	return errors.Join(errs...)
}
