package backendtest

import (
	"math"
	"math/rand/v2"

	"github.com/flashgraph/flashgraph/graph"
)

// inUnit is uniform in (−0.95, 0.95): Asin, Acos, Atanh.
func inUnit(r *rand.Rand) float64 { return 0.95 * (2*r.Float64() - 1) }

// atLeastOne is in [1.05, 5): Acosh.
func atLeastOne(r *rand.Rand) float64 { return 1.05 + 3.95*r.Float64() }

// specials mixes ±Inf, NaN, zeros and normal values: IsInf, IsNaN, Sign.
func specials(r *rand.Rand) float64 {
	switch r.IntN(6) {
	case 0:
		return math.Inf(1)
	case 1:
		return math.Inf(-1)
	case 2:
		return math.NaN()
	case 3:
		return 0
	}
	return 3 * r.NormFloat64()
}

// halves are multiples of 0.5 in [−4, 4): Round's ties to even, Floor and
// Ceil at integers.
func halves(r *rand.Rand) float64 { return float64(r.IntN(16)-8) / 2 }

// activationCases cover the elementwise ops whose expressions read
// attributes, at attribute values other than the defaults (the defaults
// run in opCases' unary loop), the two-operand and logical ones, and the
// special values of the classifying ones.
func activationCases() []opCase {
	var cs []opCase
	add := func(op, name string, fn func(c *ctx)) { cs = append(cs, opCase{op: op, name: name, fn: fn}) }
	addDT := func(op, name string, dts []graph.DType, fn func(c *ctx)) {
		cs = append(cs, opCase{op: op, name: name, dts: dts, fn: fn})
	}
	unary := func(op string, attrs graph.Attrs, g gen) func(c *ctx) {
		return func(c *ctx) {
			x, rx := c.input(c.dt, g, 3, 5, 7)
			c.expect(c.op(op, attrs, x), ref(op, attrs, f64(rx)))
		}
	}
	for _, a := range []struct {
		op, name string
		attrs    graph.Attrs
		g        gen
	}{
		{"LeakyRelu", "alpha_0.3", graph.Attrs{"alpha": graph.Float(0.3)}, normal},
		{"Elu", "alpha_0.5", graph.Attrs{"alpha": graph.Float(0.5)}, scaled(3, normal)},
		{"Celu", "alpha_2", graph.Attrs{"alpha": graph.Float(2)}, scaled(3, normal)},
		{"Selu", "alpha_2_gamma_3", graph.Attrs{"alpha": graph.Float(2), "gamma": graph.Float(3)}, scaled(3, normal)},
		{"HardSigmoid", "alpha_0.5_beta_0.6", graph.Attrs{"alpha": graph.Float(0.5), "beta": graph.Float(0.6)}, scaled(3, normal)},
		{"ThresholdedRelu", "alpha_0.5", graph.Attrs{"alpha": graph.Float(0.5)}, normal},
		{"Shrink", "bias_1.5_lambd_1", graph.Attrs{"bias": graph.Float(1.5), "lambd": graph.Float(1)}, scaled(2, normal)},
		{"Gelu", "tanh", graph.Attrs{"approximate": graph.Str("tanh")}, scaled(3, normal)},
		{"IsInf", "positive_only", graph.Attrs{"detect_negative": graph.Int(0)}, specials},
		{"IsInf", "negative_only", graph.Attrs{"detect_positive": graph.Int(0)}, specials},
		{"IsInf", "both", nil, specials},
		{"IsNaN", "specials", nil, specials},
		{"Sign", "specials", nil, specials},
		{"Round", "halves", nil, halves}, {"Floor", "halves", nil, halves}, {"Ceil", "halves", nil, halves},
	} {
		add(a.op, a.name, unary(a.op, a.attrs, a.g))
	}
	addDT("Sign", "int64", onlyInt64, func(c *ctx) {
		x, rx := c.input(graph.Int64, ints(-3, 4), 9)
		c.expect(c.op("Sign", nil, x), ref("Sign", nil, tensorFrom(graph.Int64, rx)))
	})

	binary := func(op string, attrs graph.Attrs, dt graph.DType, ga, gb gen, as, bs []int) func(c *ctx) {
		return func(c *ctx) {
			dt := dt
			if dt == 0 {
				dt = c.dt
			}
			a, ra := c.input(dt, ga, as...)
			b, rb := c.input(dt, gb, bs...)
			rdt := graph.Float64
			if !dt.IsFloat() {
				rdt = dt
			}
			c.expect(c.op(op, attrs, a, b), ref(op, attrs, tensorFrom(rdt, ra), tensorFrom(rdt, rb)))
		}
	}
	for _, op := range []string{"Min", "Max"} {
		add(op, "[3,4]_[4]", binary(op, nil, 0, normal, normal, []int{3, 4}, []int{4}))
		add(op, "[2,1,3]_[2,3]", binary(op, nil, 0, fewValues, fewValues, []int{2, 1, 3}, []int{2, 3}))
		addDT(op, "int64", onlyInt64, binary(op, nil, graph.Int64, ints(-5, 5), ints(-5, 5), []int{4, 5}, []int{5}))
	}
	fmod := graph.Attrs{"fmod": graph.Int(1)}
	add("Mod", "fmod_[3,4]_[4]", binary("Mod", fmod, 0, scaled(5, normal), awayFromZero, []int{3, 4}, []int{4}))
	addDT("Mod", "int64", onlyInt64, binary("Mod", nil, graph.Int64, ints(-20, 20), ints(1, 7), []int{4, 5}, []int{5}))
	addDT("Mod", "int64_negative_divisor", onlyInt64, binary("Mod", nil, graph.Int64, ints(-20, 20), ints(-7, -1), []int{4, 5}, []int{1}))
	addDT("Mod", "int64_fmod", onlyInt64, binary("Mod", fmod, graph.Int64, ints(-20, 20), ints(-7, -1), []int{4, 5}, []int{5}))
	add("PRelu", "slope_[4]", binary("PRelu", nil, 0, normal, positive, []int{3, 4}, []int{4}))
	add("PRelu", "slope_[3,1]", binary("PRelu", nil, 0, normal, normal, []int{2, 3, 5}, []int{3, 1}))
	for _, op := range []string{"And", "Or", "Xor"} {
		addDT(op, "[3,4]_[4]", onlyBool, binary(op, nil, graph.Bool, coin, coin, []int{3, 4}, []int{4}))
		addDT(op, "[2,1]_[2,3]", onlyBool, binary(op, nil, graph.Bool, coin, coin, []int{2, 1}, []int{2, 3}))
	}
	addDT("Not", "[3,4]", onlyBool, func(c *ctx) {
		x, rx := c.input(graph.Bool, coin, 3, 4)
		c.expect(c.op("Not", nil, x), ref("Not", nil, tensorFrom(graph.Bool, rx)))
	})
	return cs
}
