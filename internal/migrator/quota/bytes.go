package quota

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Bytes is a size flag's value: a quantity such as 2Gi, 512Mi or 0.
type Bytes int64

// Set parses a quantity.
func (b *Bytes) Set(s string) error {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return fmt.Errorf("not a size such as 2Gi or 512Mi: %w", err)
	}
	if q.Sign() < 0 {
		return fmt.Errorf("a size is not negative, got %s", s)
	}
	*b = Bytes(q.Value())
	return nil
}

func (b *Bytes) String() string {
	return resource.NewQuantity(int64(*b), resource.BinarySI).String()
}

// Type is what pflag shows as the flag's kind.
func (b *Bytes) Type() string { return "quantity" }

// Get returns the value, for the flag package's Getter.
func (b *Bytes) Get() any { return *b }
