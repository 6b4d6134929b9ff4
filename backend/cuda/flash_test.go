package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestPlanFlash(t *testing.T) {
	for _, c := range []struct {
		dt    GemmType
		dim   int
		scale float32
		tc    bool
		fwd   string
	}{
		{GemmBF16, 64, 0.125, true, "flash_fwd_bf16_d64"},
		{GemmF16, 128, 0.1, true, "flash_fwd_fp16_d128"},
		{GemmBF16, 80, 0.1, false, "flash_fwd_generic_bf16"},
		{GemmBF16, 64, -1, false, "flash_fwd_generic_bf16"},
		{GemmF32, 128, 0.1, false, "flash_fwd_generic_fp32"},
	} {
		p, err := planFlash(c.dt, c.dim, c.scale)
		if err != nil {
			t.Fatal(err)
		}
		if p.tensorCore != c.tc || p.fwd != c.fwd {
			t.Errorf("planFlash(%v, %d, %g) = %+v, want tensorCore %v fwd %s", c.dt, c.dim, c.scale, p, c.tc, c.fwd)
		}
		if p.fwdSmem > 227*1024 || p.bwdSmem > 227*1024 || p.genDQSmem > 227*1024 || p.genKVSmem > 227*1024 {
			t.Errorf("planFlash(%v, %d): shared memory over 227 KB: %+v", c.dt, c.dim, p)
		}
	}
	if _, err := planFlash(GemmF32, 257, 1); err == nil || !strings.Contains(err.Error(), "head dim 257") {
		t.Errorf("dim 257: got %v", err)
	}
	if err := checkFlashShape(0, 1, 1, 64); err == nil {
		t.Error("bh 0 accepted")
	}
}

// flashRef is a float64 reference of attention forward and backward, with the
// magnitudes of each output (the same products on absolute values), which bound
// the rounding error componentwise.
type flashRef struct {
	o, lse, dq, dk, dv        []float64
	oMag, dqMag, dkMag, dvMag []float64
}

func flashReference(q, k, v, do []float64, bh, sq, sk, dim int, scale float64, causal bool) flashRef {
	r := flashRef{
		o: make([]float64, bh*sq*dim), lse: make([]float64, bh*sq), dq: make([]float64, bh*sq*dim),
		dk: make([]float64, bh*sk*dim), dv: make([]float64, bh*sk*dim), oMag: make([]float64, bh*sq*dim),
		dqMag: make([]float64, bh*sq*dim), dkMag: make([]float64, bh*sk*dim), dvMag: make([]float64, bh*sk*dim),
	}
	p := make([]float64, sk)
	for b := range bh {
		Q, dO := q[b*sq*dim:], do[b*sq*dim:]
		K, V := k[b*sk*dim:], v[b*sk*dim:]
		for i := range sq {
			m := math.Inf(-1)
			n := sk
			if causal {
				n = min(sk, i+1)
			}
			for j := range n {
				s := 0.0
				for c := range dim {
					s += Q[i*dim+c] * K[j*dim+c]
				}
				p[j] = s * scale
				m = math.Max(m, p[j])
			}
			sum := 0.0
			for j := range n {
				p[j] = math.Exp(p[j] - m)
				sum += p[j]
			}
			r.lse[b*sq+i] = m + math.Log(sum)
			oi := r.o[(b*sq+i)*dim:]
			om := r.oMag[(b*sq+i)*dim:]
			for j := range n {
				p[j] /= sum
				for c := range dim {
					oi[c] += p[j] * V[j*dim+c]
					om[c] += p[j] * math.Abs(V[j*dim+c])
				}
			}
			dsum, dabs := 0.0, 0.0
			for c := range dim {
				dsum += dO[i*dim+c] * oi[c]
				dabs += math.Abs(dO[i*dim+c] * oi[c])
			}
			for j := range n {
				dp, dpa := 0.0, 0.0
				for c := range dim {
					dp += dO[i*dim+c] * V[j*dim+c]
					dpa += math.Abs(dO[i*dim+c] * V[j*dim+c])
				}
				ds := p[j] * (dp - dsum) * scale
				dsa := p[j] * (dpa + dabs) * scale
				for c := range dim {
					r.dq[(b*sq+i)*dim+c] += ds * K[j*dim+c]
					r.dqMag[(b*sq+i)*dim+c] += dsa * math.Abs(K[j*dim+c])
					r.dk[(b*sk+j)*dim+c] += ds * Q[i*dim+c]
					r.dkMag[(b*sk+j)*dim+c] += dsa * math.Abs(Q[i*dim+c])
					r.dv[(b*sk+j)*dim+c] += p[j] * dO[i*dim+c]
					r.dvMag[(b*sk+j)*dim+c] += p[j] * math.Abs(dO[i*dim+c])
				}
			}
		}
	}
	return r
}

// flashTensor holds one input or output on the device in element type dt.
func flashUpload(t *testing.T, d *Device, dt GemmType, x []float64) (DevicePtr, []float64) {
	t.Helper()
	rounded := make([]float64, len(x))
	var p DevicePtr
	var err error
	switch dt {
	case GemmF32:
		h := make([]float32, len(x))
		for i, v := range x {
			h[i] = float32(v)
			rounded[i] = float64(h[i])
		}
		p, err = Upload(d, h)
	default:
		h := make([]uint16, len(x))
		for i, v := range x {
			if dt == GemmBF16 {
				h[i] = BF16FromFloat32(float32(v))
				rounded[i] = float64(BF16ToFloat32(h[i]))
			} else {
				h[i] = F16FromFloat32(float32(v))
				rounded[i] = float64(F16ToFloat32(h[i]))
			}
		}
		p, err = Upload(d, h)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(p) })
	return p, rounded
}

// flashAlloc allocates n elements of dt poisoned with NaN (all bits set).
func flashAlloc(t *testing.T, d *Device, n, elem int) DevicePtr {
	t.Helper()
	p, err := d.Alloc(n * elem)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Memset(p, 0xff, n*elem); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(p) })
	return p
}

func flashDownload(t *testing.T, d *Device, dt GemmType, p DevicePtr, n int) []float64 {
	t.Helper()
	out := make([]float64, n)
	if dt == GemmF32 {
		h := make([]float32, n)
		if err := Download(d, p, h); err != nil {
			t.Fatal(err)
		}
		for i, v := range h {
			out[i] = float64(v)
		}
		return out
	}
	h := make([]uint16, n)
	if err := Download(d, p, h); err != nil {
		t.Fatal(err)
	}
	for i, v := range h {
		if dt == GemmBF16 {
			out[i] = float64(BF16ToFloat32(v))
		} else {
			out[i] = float64(F16ToFloat32(v))
		}
	}
	return out
}

// flashCheck: |got-ref| <= frac*mag + atol + rtol*|ref| elementwise, and the
// relative L2 error at most l2 unless ref is a cancellation (||ref|| < 1e-3 ||mag||).
func flashCheck(name string, got, ref, mag []float64, frac, atol, rtol, l2 float64) error {
	var en, rn, mn float64
	bad := 0
	first := ""
	for i := range ref {
		e := math.Abs(got[i] - ref[i])
		lim := atol + rtol*math.Abs(ref[i])
		if mag != nil {
			lim += frac * mag[i]
			mn += mag[i] * mag[i]
		}
		if !(e <= lim) {
			if bad == 0 {
				first = fmt.Sprintf(" first at %d: got %g want %g", i, got[i], ref[i])
			}
			bad++
		}
		en += e * e
		rn += ref[i] * ref[i]
	}
	if bad > 0 {
		return fmt.Errorf("%s: %d of %d elements out of tolerance;%s", name, bad, len(ref), first)
	}
	cancel := mag != nil && math.Sqrt(rn) < 1e-3*math.Sqrt(mn)
	if !cancel && math.Sqrt(en) > l2*math.Sqrt(rn) {
		return fmt.Errorf("%s: relative L2 error %.3g > %.3g", name, math.Sqrt(en/rn), l2)
	}
	return nil
}

func TestFlashAttentionGPU(t *testing.T) {
	d := gpu(t)
	d.SetCubinCacheDir(t.TempDir())
	type tol struct{ frac, rtol, l2 float64 }
	tols := map[GemmType]tol{GemmBF16: {1.0 / 128, 0.02, 1e-2}, GemmF16: {1.0 / 1024, 0.004, 2e-3}, GemmF32: {1e-5, 2e-5, 1e-5}}
	rng := rand.New(rand.NewPCG(7, 11))
	for _, c := range []struct {
		dt              GemmType
		bh, sq, sk, dim int
		causal          bool
	}{
		{GemmBF16, 3, 200, 200, 64, true},
		{GemmBF16, 2, 77, 300, 128, false},
		{GemmF16, 2, 300, 77, 128, true},
		{GemmF16, 2, 130, 130, 64, false},
		{GemmBF16, 2, 65, 90, 40, true},
		{GemmF32, 2, 150, 150, 128, true},
		{GemmF32, 1, 33, 70, 20, false},
	} {
		name := fmt.Sprintf("%v/bh%d/sq%d/sk%d/d%d/causal%v", c.dt, c.bh, c.sq, c.sk, c.dim, c.causal)
		t.Run(name, func(t *testing.T) {
			nq, nk := c.bh*c.sq*c.dim, c.bh*c.sk*c.dim
			gen := func(n int) []float64 {
				x := make([]float64, n)
				for i := range x {
					x[i] = rng.NormFloat64()
				}
				return x
			}
			q, qh := flashUpload(t, d, c.dt, gen(nq))
			k, kh := flashUpload(t, d, c.dt, gen(nk))
			v, vh := flashUpload(t, d, c.dt, gen(nk))
			dO, doh := flashUpload(t, d, c.dt, gen(nq))
			es := c.dt.ElemSize()
			o := flashAlloc(t, d, nq, es)
			lse := flashAlloc(t, d, c.bh*c.sq, 4)
			dq, dk, dv := flashAlloc(t, d, nq, es), flashAlloc(t, d, nk, es), flashAlloc(t, d, nk, es)
			scale := float32(1 / math.Sqrt(float64(c.dim)))
			if err := FlashForward(d, c.dt, q, k, v, o, lse, c.bh, c.sq, c.sk, c.dim, scale, c.causal); err != nil {
				t.Fatal(err)
			}
			if err := FlashBackward(d, c.dt, q, k, v, o, dO, lse, dq, dk, dv, 0, c.bh, c.sq, c.sk, c.dim, scale, c.causal); err != nil {
				t.Fatal(err)
			}
			ref := flashReference(qh, kh, vh, doh, c.bh, c.sq, c.sk, c.dim, float64(scale), c.causal)
			tl := tols[c.dt]
			lseGot := flashDownload(t, d, GemmF32, lse, c.bh*c.sq)
			for _, chk := range []error{
				flashCheck("O", flashDownload(t, d, c.dt, o, nq), ref.o, ref.oMag, tl.frac, 0, tl.rtol, tl.l2),
				flashCheck("LSE", lseGot, ref.lse, nil, 0, 1e-3, 2e-5, 1e-5),
				flashCheck("dQ", flashDownload(t, d, c.dt, dq, nq), ref.dq, ref.dqMag, tl.frac, 0, tl.rtol, tl.l2),
				flashCheck("dK", flashDownload(t, d, c.dt, dk, nk), ref.dk, ref.dkMag, tl.frac, 0, tl.rtol, tl.l2),
				flashCheck("dV", flashDownload(t, d, c.dt, dv, nk), ref.dv, ref.dvMag, tl.frac, 0, tl.rtol, tl.l2),
			} {
				if chk != nil {
					t.Error(chk)
				}
			}
		})
	}
}
