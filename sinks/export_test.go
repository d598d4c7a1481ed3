package sinks

// FromKafka is fromKafka, for the black-box tests.
var FromKafka = fromKafka
