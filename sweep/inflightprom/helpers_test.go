package inflightprom_test

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// only keeps the metrics of one name from a collector, for testutil.ToFloat64.
type only struct {
	c    prometheus.Collector
	name string
}

func collectorFor(c prometheus.Collector, name string) prometheus.Collector { return only{c, name} }

func (o only) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(o, ch) }
func (o only) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric, 64)
	o.c.Collect(all)
	close(all)
	for m := range all {
		if strings.Contains(m.Desc().String(), `fqName: "`+o.name+`"`) {
			ch <- m
		}
	}
}
