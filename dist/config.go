package dist

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Config says which rank this process is and where rank 0 waits for the others.
type Config struct {
	Rank       int    // this process, 0 ≤ Rank < WorldSize
	WorldSize  int    // number of processes (one per GPU) in the job
	LocalRank  int    // index of this process on its host: the GPU it drives
	MasterAddr string // host of rank 0's rendezvous listener
	MasterPort int    // its TCP port
}

// Environment variables read by FromEnv, named as torchrun sets them so that
// jobs launched by torchrun, SLURM scripts written for it, or by hand work alike.
const (
	EnvRank       = "RANK"
	EnvWorldSize  = "WORLD_SIZE"
	EnvLocalRank  = "LOCAL_RANK"
	EnvMasterAddr = "MASTER_ADDR"
	EnvMasterPort = "MASTER_PORT"
)

// DefaultMasterPort is the port used when neither a flag nor MASTER_PORT gives one
// (torchrun's default too, so a user's firewall rule carries over).
const DefaultMasterPort = 29500

// FromEnv reads the torchrun-style variables through getenv (os.Getenv in
// production; a map in tests). Variables that are unset keep the defaults of a
// single-process job: rank 0 of 1 on 127.0.0.1:DefaultMasterPort, and LOCAL_RANK
// defaults to RANK (one host). A variable that is set but is not a number is an
// error naming it. The result is validated.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{Rank: 0, WorldSize: 1, LocalRank: -1, MasterAddr: "127.0.0.1", MasterPort: DefaultMasterPort}
	ints := []struct {
		name string
		dst  *int
	}{{EnvRank, &c.Rank}, {EnvWorldSize, &c.WorldSize}, {EnvLocalRank, &c.LocalRank}, {EnvMasterPort, &c.MasterPort}}
	for _, v := range ints {
		s := strings.TrimSpace(getenv(v.name))
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return Config{}, fmt.Errorf("dist: %s=%q is not an integer", v.name, s)
		}
		*v.dst = n
	}
	if s := strings.TrimSpace(getenv(EnvMasterAddr)); s != "" {
		c.MasterAddr = s
	}
	if c.LocalRank == -1 {
		c.LocalRank = c.Rank
	}
	return c, c.Validate()
}

// Validate checks the configuration and says what is wrong in terms of the
// flags and variables a user sets.
func (c Config) Validate() error {
	if c.WorldSize < 1 {
		return fmt.Errorf("dist: world size must be at least 1, got %d (-world-size or %s)", c.WorldSize, EnvWorldSize)
	}
	if c.Rank < 0 || c.Rank >= c.WorldSize {
		return fmt.Errorf("dist: rank %d is outside [0, %d) for world size %d (-rank or %s)", c.Rank, c.WorldSize, c.WorldSize, EnvRank)
	}
	if c.LocalRank < 0 || c.LocalRank >= c.WorldSize {
		return fmt.Errorf("dist: local rank %d is outside [0, %d) (%s)", c.LocalRank, c.WorldSize, EnvLocalRank)
	}
	if c.MasterPort < 1 || c.MasterPort > 65535 {
		return fmt.Errorf("dist: master port %d is outside [1, 65535] (-master-port or %s)", c.MasterPort, EnvMasterPort)
	}
	if c.WorldSize > 1 {
		if c.MasterAddr == "" {
			return fmt.Errorf("dist: a job of %d ranks needs the address of rank 0 (-master-addr or %s)", c.WorldSize, EnvMasterAddr)
		}
		if strings.ContainsAny(c.MasterAddr, " /") {
			return fmt.Errorf("dist: master address %q is not a host name or IP address", c.MasterAddr)
		}
	}
	return nil
}

// Address is the host:port that rank 0 listens on and the others dial.
func (c Config) Address() string {
	return net.JoinHostPort(c.MasterAddr, strconv.Itoa(c.MasterPort))
}

// String is a one-line summary for logs: "rank 1/2 (local 1) via 10.0.0.1:29500".
func (c Config) String() string {
	return fmt.Sprintf("rank %d/%d (local %d) via %s", c.Rank, c.WorldSize, c.LocalRank, c.Address())
}
