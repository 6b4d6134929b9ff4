// Package units writes byte counts for people to read. The memory plan, the
// train report and the ONNX import's limits each print sizes; they share this
// one writer and differ only in how many digits each unit keeps.
package units

import "fmt"

// binary are the units Bytes writes in, each 1024 times the one before.
var binary = [...]string{"KiB", "MiB", "GiB", "TiB"}

// Bytes writes n bytes in the largest binary unit it reaches among the first
// len(decimals) of KiB, MiB, GiB and TiB (the last of them takes every larger
// count): decimals[i] is how many digits follow the point in unit i, so
// Bytes(n, 1, 2, 2) writes "64.0 KiB", "695.64 MiB" and "3.92 GiB". A count
// under a KiB, or any count with no decimals given, is written whole: "512 B".
// Decimals past the fourth are ignored.
func Bytes(n int64, decimals ...int) string {
	u := -1 // the unit: index into binary, -1 for bytes
	for u+1 < min(len(decimals), len(binary)) && n >= int64(1)<<(10*(u+2)) {
		u++
	}
	if u < 0 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.*f %s", decimals[u], float64(n)/float64(int64(1)<<(10*(u+1))), binary[u])
}
