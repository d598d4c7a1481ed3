package audit

// For the benchmarks of the deciding pass alone.
type Replayer = replayer

var NewReplayer = newReplayer

// For the benchmarks of the analysing pass alone.
type Analyzer = analyzer

var NewAnalyzer = newAnalyzer
